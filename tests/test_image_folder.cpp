// ImageFolder indexing rules, split resolution and class maps.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/common.h"
#include "data/image_folder.h"
#include "temp_dir.h"

using namespace vit::data;
namespace fs = std::filesystem;

using vit::testing::TempDir;

namespace {

void touch(const fs::path& p) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << "x";  // content is irrelevant to indexing
}

std::string rel(const std::string& file, const std::string& base) {
  return fs::path(file).lexically_relative(base).generic_string();
}

}  // namespace

TEST(ImageFolder, ExtensionsCaseInsensitive) {
  EXPECT_TRUE(has_image_extension("a.jpg"));
  EXPECT_TRUE(has_image_extension("a.JPG"));
  EXPECT_TRUE(has_image_extension("a.Jpeg"));
  EXPECT_TRUE(has_image_extension("a.b.PNG"));
  EXPECT_FALSE(has_image_extension("a.gif"));
  EXPECT_FALSE(has_image_extension("jpg"));
  EXPECT_FALSE(has_image_extension("a.jpg.txt"));
}

TEST(ImageFolder, RecursiveSortedFirstLevelLabels) {
  TempDir t;
  const fs::path s = t.path / "train";
  touch(s / "dog" / "b.JPG");
  touch(s / "dog" / "a.png");
  touch(s / "dog" / "deep" / "er" / "c.jpeg");
  touch(s / "dog" / "notes.txt");
  touch(s / "cat" / "x.Jpeg");
  touch(s / "class10" / "1.jpg");
  touch(s / "class2" / "1.jpg");
  touch(s / "Zebra" / "z.png");
  touch(s / ".ipynb_checkpoints" / "junk.jpg");  // hidden: ignored
  touch(s / "cat" / ".hidden.jpg");
  touch(s / "stray.jpg");  // no class: ignored
  fs::create_directories(s / "empty_class");
  const FolderIndex idx = index_image_folder(s.string());
  // Byte-wise sort: upper case first, "class10" < "class2"; empty folder keeps its index.
  const std::vector<std::string> classes = {"Zebra",  "cat", "class10",
                                            "class2", "dog", "empty_class"};
  EXPECT_EQ(idx.classes, classes);
  std::vector<std::string> files;
  for (const auto& f : idx.files) files.push_back(rel(f, s.string()));
  const std::vector<std::string> want = {"Zebra/z.png",       "cat/x.Jpeg", "class10/1.jpg",
                                         "class2/1.jpg",      "dog/a.png",  "dog/b.JPG",
                                         "dog/deep/er/c.jpeg"};
  EXPECT_EQ(files, want);
  EXPECT_EQ(idx.labels, (std::vector<int32_t>{0, 1, 2, 3, 4, 4, 4}));
  // Paths are usable as given.
  for (const auto& f : idx.files) EXPECT_TRUE(fs::exists(f)) << f;
}

TEST(ImageFolder, FollowsSymlinksAndSurvivesCycles) {
  TempDir t;
  const fs::path s = t.path / "train";
  const fs::path outside = t.path / "elsewhere";
  touch(outside / "o1.jpg");
  touch(outside / "sub" / "o2.png");
  touch(s / "a" / "1.jpg");
  fs::create_directory_symlink(outside, s / "b");           // class folder is a link
  fs::create_directory_symlink(s / "a", s / "a" / "loop");  // cycle inside a class
  fs::create_directory_symlink(s, s / "a" / "up");          // link back to the split root
  touch(t.path / "real.jpg");
  fs::create_symlink(t.path / "real.jpg", s / "a" / "2.jpg");     // file link
  fs::create_symlink(t.path / "missing.jpg", s / "a" / "3.jpg");  // broken link: skipped
  const FolderIndex idx = index_image_folder(s.string());
  EXPECT_EQ(idx.classes, (std::vector<std::string>{"a", "b"}));
  std::vector<std::string> files;
  for (const auto& f : idx.files) files.push_back(rel(f, s.string()));
  EXPECT_EQ(files, (std::vector<std::string>{"a/1.jpg", "a/2.jpg", "b/o1.jpg", "b/sub/o2.png"}));
  EXPECT_EQ(idx.labels, (std::vector<int32_t>{0, 0, 1, 1}));
}

TEST(ImageFolder, ClassMap) {
  TempDir t;
  const fs::path s = t.path / "val";
  touch(s / "cat" / "1.jpg");
  touch(s / "dog" / "1.jpg");
  touch(s / "dog" / "2.jpg");
  const FolderIndex idx = index_image_folder(s.string(), {"dog", "bird", "cat"});
  EXPECT_EQ(idx.classes, (std::vector<std::string>{"dog", "bird", "cat"}));
  std::vector<std::string> files;
  for (const auto& f : idx.files) files.push_back(rel(f, s.string()));
  EXPECT_EQ(files, (std::vector<std::string>{"dog/1.jpg", "dog/2.jpg", "cat/1.jpg"}));
  EXPECT_EQ(idx.labels, (std::vector<int32_t>{0, 0, 2}));
  // Unknown class folders are named in the error.
  try {
    index_image_folder(s.string(), {"dog", "bird"});
    FAIL();
  } catch (const vit::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cat"), std::string::npos) << m;
    EXPECT_NE(m.find(s.string()), std::string::npos) << m;
  }
  EXPECT_THROW(index_image_folder(s.string(), {"dog", "cat", "dog"}), vit::Error);
}

TEST(ImageFolder, ReadClassMap) {
  TempDir t;
  const fs::path p = t.path / "map.txt";
  std::ofstream(p) << "n01440764\r\n  n01443537 \nzebra\n\n\n";
  EXPECT_EQ(read_class_map(p.string()),
            (std::vector<std::string>{"n01440764", "n01443537", "zebra"}));
  std::ofstream(p) << "a\n\nb\n";
  EXPECT_THROW(read_class_map(p.string()), vit::Error);  // blank line in the middle
  std::ofstream(p) << "a\nb\na\n";
  try {
    read_class_map(p.string());
    FAIL();
  } catch (const vit::Error& e) {
    EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos);
  }
  std::ofstream(p) << "\n";
  EXPECT_THROW(read_class_map(p.string()), vit::Error);
  EXPECT_THROW(read_class_map((t.path / "nope.txt").string()), vit::Error);
}

TEST(ImageFolder, ZeroImagesError) {
  TempDir t;
  // Images without class sub-folders: the classic mistake.
  touch(t.path / "flat" / "1.jpg");
  touch(t.path / "flat" / "2.jpg");
  try {
    index_image_folder((t.path / "flat").string());
    FAIL();
  } catch (const vit::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("Found 0 images in subfolders of " + (t.path / "flat").string()),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("no class sub-folders"), std::string::npos) << m;
    EXPECT_NE(m.find("<split>/<class>/<image>"), std::string::npos) << m;
  }
  // Class folders with only non-images.
  touch(t.path / "txt" / "a" / "readme.txt");
  EXPECT_THROW(index_image_folder((t.path / "txt").string()), vit::Error);
  // Empty folder, missing folder, a file instead of a folder.
  fs::create_directories(t.path / "empty");
  EXPECT_THROW(index_image_folder((t.path / "empty").string()), vit::Error);
  EXPECT_THROW(index_image_folder((t.path / "missing").string()), vit::Error);
  EXPECT_THROW(index_image_folder((t.path / "flat" / "1.jpg").string()), vit::Error);
}

TEST(ImageFolder, FindSplitSynonyms) {
  TempDir t;
  fs::create_directories(t.path / "training");
  fs::create_directories(t.path / "validation");
  EXPECT_EQ(find_split(t.str(), true), (t.path / "training").string());
  EXPECT_EQ(find_split(t.str(), false), (t.path / "validation").string());
  fs::create_directories(t.path / "train");
  fs::create_directories(t.path / "val");
  EXPECT_EQ(find_split(t.str(), true), (t.path / "train").string());  // exact name first
  EXPECT_EQ(find_split(t.str(), false), (t.path / "val").string());
  for (const char* n : {"valid", "eval", "evaluation"}) {
    TempDir u;
    fs::create_directories(u.path / n);
    EXPECT_EQ(find_split(u.str(), false), (u.path / n).string());
    EXPECT_THROW(find_split(u.str(), true), vit::Error);
  }
  TempDir w;
  fs::create_directories(w.path / "images");
  try {
    find_split(w.str(), false);
    FAIL();
  } catch (const vit::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("validation"), std::string::npos) << m;
    EXPECT_NE(m.find("images"), std::string::npos) << m;  // shows what is there
  }
  // A file named like a split is not a split.
  TempDir x;
  std::ofstream(x.path / "train") << "x";
  EXPECT_THROW(find_split(x.str(), true), vit::Error);
}
