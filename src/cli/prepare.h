// `vitrain prepare`: packs an ImageFolder root into OUT/train.vitpack + OUT/val.vitpack (images
// decoded once, downscaled to --max-side, stored raw or as JPEG; data/packed.h). Training and
// evaluation read OUT transparently (--data-dir OUT).
#pragma once

namespace vit {

int run_prepare(int argc, char** argv);  // argv[0] is the subcommand name

}  // namespace vit
