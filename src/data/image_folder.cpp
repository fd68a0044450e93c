#include "data/image_folder.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>

#include "core/common.h"

namespace vit::data {

namespace fs = std::filesystem;

namespace {

const char* kLayoutHelp =
    "Expected layout: <split>/<class>/<image> with .jpg/.jpeg/.png files (any letter case), e.g.\n"
    "  train/cat/001.jpg\n"
    "  train/dog/sub/002.png\n"
    "Class folders are the first-level sub-folders of the split folder; images lying directly "
    "in the split folder have no class and are ignored.";

bool is_hidden(const std::string& name) {
  return !name.empty() && name[0] == '.';
}

using DevIno = std::pair<uint64_t, uint64_t>;

bool dev_ino(const fs::path& p, DevIno& out) {
  struct stat st;
  if (::stat(p.c_str(), &st) != 0) return false;  // follows links; broken link -> false
  out = {uint64_t(st.st_dev), uint64_t(st.st_ino)};
  return true;
}

// Appends image paths under `dir` relative to `base_rel` (e.g. "cat/sub/x.jpg"); follows links,
// walks each physical directory once.
void walk(const fs::path& dir, const std::string& rel, std::set<DevIno>& seen,
          std::vector<std::string>& out) {
  DevIno id;
  if (!dev_ino(dir, id) || !seen.insert(id).second) return;
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  if (ec) throw Error(fmt::format("{}: cannot list folder: {}", dir.string(), ec.message()));
  for (; it != end; it.increment(ec)) {
    if (ec) throw Error(fmt::format("{}: cannot list folder: {}", dir.string(), ec.message()));
    const std::string name = it->path().filename().string();
    if (is_hidden(name)) continue;
    std::error_code ec2;
    const fs::file_status st = fs::status(it->path(), ec2);  // follows symlinks
    if (ec2) continue;                                       // broken link: skip
    if (fs::is_directory(st)) {
      walk(it->path(), rel + name + "/", seen, out);
    } else if (fs::is_regular_file(st) && has_image_extension(name)) {
      out.push_back(rel + name);
    }
  }
}

std::string strip(const std::string& s) {
  const char* ws = " \t\r\n\v\f";
  const size_t a = s.find_first_not_of(ws);
  if (a == std::string::npos) return "";
  const size_t b = s.find_last_not_of(ws);
  return s.substr(a, b - a + 1);
}

}  // namespace

bool has_image_extension(const std::string& filename) {
  const size_t dot = filename.rfind('.');
  if (dot == std::string::npos) return false;
  std::string ext = filename.substr(dot + 1);
  for (char& ch : ext) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return ext == "jpg" || ext == "jpeg" || ext == "png";
}

FolderIndex index_image_folder(const std::string& split_dir,
                               const std::vector<std::string>& class_map) {
  std::error_code ec;
  if (!fs::is_directory(split_dir, ec))
    throw Error(fmt::format("{}: data folder does not exist or is not a folder", split_dir));

  // First-level class folders (links followed) and stray top-level images.
  std::vector<std::string> class_dirs;
  size_t stray_images = 0;
  {
    fs::directory_iterator it(split_dir, ec), end;
    if (ec) throw Error(fmt::format("{}: cannot list folder: {}", split_dir, ec.message()));
    for (; it != end; it.increment(ec)) {
      if (ec) throw Error(fmt::format("{}: cannot list folder: {}", split_dir, ec.message()));
      const std::string name = it->path().filename().string();
      if (is_hidden(name)) continue;
      std::error_code ec2;
      const fs::file_status st = fs::status(it->path(), ec2);
      if (ec2) continue;
      if (fs::is_directory(st))
        class_dirs.push_back(name);
      else if (fs::is_regular_file(st) && has_image_extension(name))
        ++stray_images;
    }
  }
  std::sort(class_dirs.begin(), class_dirs.end());  // byte-wise

  FolderIndex idx;
  std::unordered_map<std::string, int32_t> class_id;
  if (class_map.empty()) {
    idx.classes = class_dirs;
  } else {
    idx.classes = class_map;
    std::vector<std::string> unknown;
    std::set<std::string> in_map(class_map.begin(), class_map.end());
    for (const std::string& d : class_dirs)
      if (!in_map.count(d)) unknown.push_back(d);
    if (!unknown.empty()) {
      std::string list;
      for (size_t i = 0; i < unknown.size() && i < 20; ++i) list += (i ? ", " : "") + unknown[i];
      if (unknown.size() > 20) list += fmt::format(", ... ({} in all)", unknown.size());
      throw Error(fmt::format("{}: {} class folder(s) not in the class map ({} classes): {}",
                              split_dir, unknown.size(), class_map.size(), list));
    }
  }
  for (size_t i = 0; i < idx.classes.size(); ++i) {
    if (!class_id.emplace(idx.classes[i], int32_t(i)).second)
      throw Error(
          fmt::format("{}: duplicate class name '{}' in the class map", split_dir, idx.classes[i]));
  }

  const std::string base =
      split_dir.empty() || split_dir.back() == '/' ? split_dir : split_dir + "/";
  DevIno root_id{};
  const bool have_root = dev_ino(split_dir, root_id);
  for (const std::string& cls : class_dirs) {
    // Per class: each physical folder walked once (cycles end, no duplicates inside a class);
    // a link back to the split folder is never entered.
    std::set<DevIno> seen;
    if (have_root) seen.insert(root_id);
    std::vector<std::string> files;
    walk(fs::path(split_dir) / cls, cls + "/", seen, files);
    std::sort(files.begin(), files.end());
    const int32_t label = class_id.at(cls);
    for (std::string& f : files) {
      idx.files.push_back(base + f);
      idx.labels.push_back(label);
    }
  }
  // class_dirs is sorted byte-wise; with a class map, re-order by label (stable keeps paths).
  if (!class_map.empty()) {
    std::vector<size_t> order(idx.files.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return idx.labels[a] < idx.labels[b]; });
    FolderIndex sorted;
    sorted.classes = std::move(idx.classes);
    for (size_t i : order) {
      sorted.files.push_back(std::move(idx.files[i]));
      sorted.labels.push_back(idx.labels[i]);
    }
    idx = std::move(sorted);
  }

  if (idx.files.empty()) {
    std::string why;
    if (class_dirs.empty() && stray_images > 0)
      why = fmt::format(" It has {} image(s) but no class sub-folders.", stray_images);
    else if (class_dirs.empty())
      why = " It has no sub-folders.";
    else
      why = fmt::format(" It has {} sub-folder(s) but none contains images.", class_dirs.size());
    throw Error(
        fmt::format("Found 0 images in subfolders of {}. Supported image extensions are .jpg, "
                    ".jpeg, .png.{}\n{}",
                    split_dir, why, kLayoutHelp));
  }
  return idx;
}

std::string find_split(const std::string& root, bool train) {
  static const std::vector<std::string> train_names = {"train", "training"};
  static const std::vector<std::string> eval_names = {"val", "valid", "validation", "eval",
                                                      "evaluation"};
  const auto& names = train ? train_names : eval_names;
  std::error_code ec;
  if (!fs::is_directory(root, ec))
    throw Error(fmt::format("{}: data folder does not exist or is not a folder", root));
  for (const std::string& n : names) {
    const fs::path p = fs::path(root) / n;
    if (fs::is_directory(p, ec)) return p.string();
  }
  std::vector<std::string> present;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec))
    if (fs::is_directory(it->status())) present.push_back(it->path().filename().string());
  std::sort(present.begin(), present.end());
  std::string tried, have;
  for (const auto& n : names) tried += (tried.empty() ? "" : ", ") + n;
  for (size_t i = 0; i < present.size() && i < 20; ++i) have += (i ? ", " : "") + present[i];
  if (present.size() > 20) have += ", ...";
  throw Error(fmt::format("{}: no {} split folder (tried {}; found: {})", root,
                          train ? "training" : "validation", tried,
                          have.empty() ? "no sub-folders" : have));
}

std::vector<std::string> read_class_map(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw Error(fmt::format("{}: cannot open class map file", path));
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(f, line)) lines.push_back(strip(line));
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (lines.empty()) throw Error(fmt::format("{}: class map file is empty", path));
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].empty())
      throw Error(
          fmt::format("{}: blank line {} in class map (one class name per line)", path, i + 1));
    auto [it, fresh] = seen.emplace(lines[i], i);
    if (!fresh)
      throw Error(fmt::format("{}: class '{}' appears twice in class map (lines {} and {})", path,
                              lines[i], it->second + 1, i + 1));
  }
  return lines;
}

}  // namespace vit::data
