// ImageFolder data sets: <root>/<split>/<class>/**/*.{jpg,jpeg,png}.
//
// Rules (torchvision ImageFolder semantics, with timm's recursive walk and split synonyms):
// * label = the FIRST-LEVEL folder under the split directory (`split/<class>/...`); images in
//   deeper sub-folders belong to that first-level class (unlike timm's leaf-folder label).
// * Files are found recursively; symbolic links to files and folders are followed (a folder
//   reached twice through links is walked once, so link cycles terminate).
// * Extensions .jpg .jpeg .png, compared case-insensitively (.JPG, .Jpeg, ...). The actual
//   format is decided later from the file's magic bytes.
// * Entries whose name starts with '.' (e.g. .ipynb_checkpoints, .DS_Store) are ignored, and so
//   are image files lying directly in the split directory (they have no class).
// * Class order: plain byte-wise sort of the class folder names (Python's sorted(), like
//   torchvision; "class10" < "class2"; upper case before lower case). A class folder with no
//   images still gets its index. With a class map the order is the map's line order, and class
//   folders missing from the map are an error (listed in the message); map classes without a
//   folder are allowed (a validation split may lack some classes).
// * Files are ordered by (label, path inside the class folder, byte-wise), so the index is
//   deterministic across machines and file systems.
// Zero images -> vit::Error "Found 0 images in subfolders of DIR ..." with the expected layout.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace vit::data {

struct FolderIndex {
  std::vector<std::string> files;    // split_dir + "/" + <class>/<relative path>
  std::vector<int32_t> labels;       // (files.size()), index into classes
  std::vector<std::string> classes;  // class index -> class (folder) name
};

// Indexes one split directory (e.g. /data/imagenet/train). class_map empty = derive the classes
// from the folders; otherwise it fixes names and order (use the training split's classes for the
// validation split so indices agree).
FolderIndex index_image_folder(const std::string& split_dir,
                               const std::vector<std::string>& class_map = {});

// Resolves the split folder under a data root, as timm does: train -> "train", "training";
// eval -> "val", "valid", "validation", "eval", "evaluation" (first existing directory wins).
// Throws vit::Error naming the root, the names tried and the folders that do exist.
std::string find_split(const std::string& root, bool train);

// Class map file: one class name per line, index = line number (timm's --class-map .txt).
// Surrounding whitespace and '\r' are stripped; trailing blank lines are ignored; blank lines in
// the middle, duplicates, or an empty file are errors naming the file.
std::vector<std::string> read_class_map(const std::string& path);

// True for .jpg/.jpeg/.png in any letter case.
bool has_image_extension(const std::string& filename);

}  // namespace vit::data
