// Writes the seed corpus of the fuzz targets: small valid inputs, made with the project's own
// writers where it has one (safetensors, npy, packed, args.yaml, JPEG/PNG encoders), libjpeg and
// libpng directly for the image variants our encoders do not produce (progressive, CMYK,
// palette, 16-bit, interlaced), and by hand for formats we only read (IDX, CIFAR).
//   build-fuzz/fuzz/make_corpus fuzz/corpus      (scripts/fuzz.sh corpus)
// Deterministic: running it again rewrites the same bytes.
#include <png.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>
// clang-format off
#include <jpeglib.h>
// clang-format on

#include "cli/train_args.h"
#include "data/decode.h"
#include "data/packed.h"
#include "io/npy.h"
#include "io/safetensors.h"

namespace fs = std::filesystem;
using vit::Index;
using vit::data::Image;
using Bytes = std::vector<uint8_t>;

namespace {

fs::path g_out;

void save(const std::string& target, const std::string& name, const void* p, size_t n) {
  fs::create_directories(g_out / target);
  std::ofstream f(g_out / target / name, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(p), std::streamsize(n));
  if (!f) {
    std::fprintf(stderr, "make_corpus: cannot write %s/%s\n", target.c_str(), name.c_str());
    std::exit(1);
  }
}
void save(const std::string& target, const std::string& name, const Bytes& b) {
  save(target, name, b.data(), b.size());
}
void save(const std::string& target, const std::string& name, const std::string& s) {
  save(target, name, s.data(), s.size());
}

void put_u16(Bytes& b, uint16_t v) {
  for (int i = 0; i < 2; ++i) b.push_back(uint8_t(v >> (8 * i)));
}
void put_u32(Bytes& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(uint8_t(v >> (8 * i)));
}
void put_u64(Bytes& b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(uint8_t(v >> (8 * i)));
}
void put_be32(Bytes& b, uint32_t v) {
  for (int i = 3; i >= 0; --i) b.push_back(uint8_t(v >> (8 * i)));
}

Image pattern(int h, int w, int c) {
  Image img(h, w, c);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int k = 0; k < c; ++k) img.at(y, x)[k] = uint8_t(x * 37 + y * 11 + k * 80);
  return img;
}

// ---------------------------------------------------------------------------------------------

void safetensors_seeds(const fs::path& tmp) {
  using vit::io::DType;
  auto tensor = [](const char* name, DType d, std::vector<Index> shape) {
    vit::io::Tensor t;
    t.name = name;
    t.dtype = d;
    t.shape = std::move(shape);
    t.data.resize(size_t(t.numel()) * vit::io::dtype_size(d));
    for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = uint8_t(i * 7 + 60);
    return t;
  };
  vit::io::SafeTensors all;
  all.metadata["note"] = "fuzz seed";
  all.add(tensor("w.f32", DType::F32, {2, 3}));
  all.add(tensor("w.f64", DType::F64, {2}));
  all.add(tensor("w.bf16", DType::BF16, {4}));
  all.add(tensor("w.f16", DType::F16, {1, 3}));
  all.add(tensor("i.i64", DType::I64, {1}));
  all.add(tensor("i.i32", DType::I32, {2}));
  all.add(tensor("u.u8", DType::U8, {5}));
  all.add(tensor("scalar", DType::F32, {}));
  all.add(tensor("empty", DType::F32, {0, 3}));
  vit::io::SafeTensors one;
  one.add(tensor("cls_token", DType::F32, {1, 1, 4}));
  vit::io::SafeTensors none;
  int k = 0;
  for (const auto* st : {&all, &one, &none}) {
    const fs::path p = tmp / "seed.safetensors";
    vit::io::write_safetensors(p.string(), *st);
    std::ifstream f(p, std::ios::binary);
    save("safetensors", "seed" + std::to_string(k++) + ".safetensors",
         Bytes(std::istreambuf_iterator<char>(f), {}));
  }
}

void idx_seeds(const fs::path& tmp) {
  Bytes images = {0, 0, 0x08, 3};
  for (uint32_t d : {3u, 4u, 4u}) put_be32(images, d);
  for (int i = 0; i < 3 * 16; ++i) images.push_back(uint8_t(i * 5));
  Bytes labels = {0, 0, 0x08, 1};
  put_be32(labels, 3);
  for (uint8_t l : {0, 7, 9}) labels.push_back(l);
  save("idx", "images.idx3", images);
  save("idx", "labels.idx1", labels);
  // The same images gzip-compressed (read_idx gunzips transparently).
  const fs::path gz = tmp / "images.gz";
  gzFile f = gzopen(gz.string().c_str(), "wb9");
  gzwrite(f, images.data(), unsigned(images.size()));
  gzclose(f);
  std::ifstream in(gz, std::ios::binary);
  save("idx", "images.idx3.gz", Bytes(std::istreambuf_iterator<char>(in), {}));
}

void npy_seeds(const fs::path& tmp) {
  const std::vector<std::vector<Index>> shapes = {{2, 3}, {5}, {}, {0, 4}};
  const std::vector<float> values = {0.5f, -1, 2, 3.25f, 1e-3f, 7};
  int k = 0;
  for (const auto& shape : shapes) {
    const fs::path p = tmp / "seed.npy";
    vit::io::write_npy_f32(p.string(), values.data(), shape);
    std::ifstream f(p, std::ios::binary);
    save("npy", "seed" + std::to_string(k++) + ".npy",
         Bytes(std::istreambuf_iterator<char>(f), {}));
  }
  // Format 2.0 (4-byte header length), double-quoted keys, no trailing comma.
  const std::string dict = "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2,)}\n";
  Bytes b = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0};
  put_u32(b, uint32_t(dict.size()));
  b.insert(b.end(), dict.begin(), dict.end());
  for (int i = 0; i < 8; ++i) b.push_back(uint8_t(i));
  save("npy", "v2.npy", b);
}

// Input layout of fuzz_cifar: kind byte, u16 length of the names text, names, batch records.
void cifar_seeds() {
  auto seed = [](bool cifar100, int classes, int records, bool names) {
    Bytes b = {uint8_t(cifar100)};
    std::string text;
    if (names)
      for (int i = 0; i < classes; ++i)
        text += "class" + std::to_string(i) + (i % 2 ? "\r\n" : "\n");
    put_u16(b, uint16_t(text.size()));
    b.insert(b.end(), text.begin(), text.end());
    for (int r = 0; r < records; ++r) {
      if (cifar100) b.push_back(uint8_t(r % 20));  // coarse label
      b.push_back(uint8_t((r * 3) % classes));
      for (int i = 0; i < 3 * 32 * 32; ++i) b.push_back(uint8_t(i + r));
    }
    return b;
  };
  save("cifar", "cifar10_names.bin", seed(false, 10, 2, true));
  save("cifar", "cifar10_plain.bin", seed(false, 10, 1, false));
  save("cifar", "cifar100_names.bin", seed(true, 100, 1, true));
}

void packed_seeds(const fs::path& tmp) {
  // Real files from write_packed (data at 4096): raw and JPEG, from a three-image folder.
  vit::data::FolderIndex idx;
  idx.classes = {"ant", "bee"};
  const std::vector<std::pair<Image, bool>> images = {
      {pattern(6, 9, 3), true}, {pattern(8, 5, 3), false}, {pattern(4, 4, 1), true}};
  for (size_t i = 0; i < images.size(); ++i) {
    const auto& [img, png] = images[i];
    const fs::path p = tmp / ("img" + std::to_string(i) + (png ? ".png" : ".jpg"));
    const Bytes b = png ? vit::data::encode_png(img) : vit::data::encode_jpeg(img, 90);
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), b.size());
    idx.files.push_back(p.string());
    idx.labels.push_back(int32_t(i % 2));
  }
  for (const bool jpeg : {false, true}) {
    const fs::path p = tmp / "seed.vitpack";
    vit::data::write_packed(p.string(), idx, 0, jpeg, 85, 1);
    std::ifstream f(p, std::ios::binary);
    save("packed", jpeg ? "jpeg.vitpack" : "raw.vitpack",
         Bytes(std::istreambuf_iterator<char>(f), {}));
  }
  // A compact hand-made file (data right after the names, as the reader allows) with a raw
  // grey entry, which write_packed never produces (it stores RGB).
  const std::string name = "cls";
  Bytes names;
  put_u32(names, uint32_t(name.size()));
  names.insert(names.end(), name.begin(), name.end());
  const Bytes pixels = {10, 20, 30, 40, 50, 60};  // 2x3 grey
  const uint64_t data_offset = 64 + names.size();
  Bytes b = {'V', 'I', 'T', 'P', 'A', 'C', 'K', '1'};
  put_u32(b, 1);  // version
  put_u32(b, 0);  // raw
  put_u64(b, 1);  // count
  put_u32(b, 1);  // classes
  put_u32(b, 0);  // max_side
  put_u64(b, names.size());
  put_u64(b, data_offset);
  put_u64(b, data_offset + pixels.size());
  put_u32(b, 0);
  put_u32(b, 0);
  b.insert(b.end(), names.begin(), names.end());
  b.insert(b.end(), pixels.begin(), pixels.end());
  put_u64(b, 0);   // offset
  put_u32(b, 6);   // size
  put_u32(b, 0);   // label
  put_u16(b, 2);   // h
  put_u16(b, 3);   // w
  b.push_back(1);  // c
  b.push_back(0);  // mode raw
  b.push_back(0);
  b.push_back(0);
  save("packed", "gray_compact.vitpack", b);
}

void config_seeds() {
  const char* argv[] = {"train"};
  save("config", "defaults.yaml", vit::to_yaml(vit::parse_train_args(1, argv)));
  for (const char* recipe : {"fmnist.yaml", "fmnist_quick.yaml"}) {
    std::ifstream f(fs::path(VIT_SOURCE_DIR) / "recipes" / recipe, std::ios::binary);
    save("config", recipe, std::string(std::istreambuf_iterator<char>(f), {}));
  }
  save("config", "mixed.yaml",
       std::string("# flags with '-' or '_', null strings, booleans, flow style\n"
                   "batch-size: 32\nexperiment: null\nmodel_ema: true\nbudget: 1h30m\n"
                   "aa: rand-m9-mstd0.5-inc1\ncurriculum: efficienttrain\n"
                   "et_table: 96,96,128,128,160,160,192,192,224,224\n"
                   "mixup: 0.8\ncutmix: 1.0\nreprob: 0.25\n"));
  save("config", "flow.yaml", std::string("{lr: 0.001, epochs: 2, device: cpu, seed: 7}\n"));
  save("config", "empty.yaml", std::string(""));
  // Text beyond ASCII: valid UTF-8 is kept; an overlong '.' (0xc0 0xae) in a string is refused
  // (the YAML emitter decoded it, so args.yaml read back a different --aa: fuzz_config,
  // 2026-11-25).
  save("config", "utf8.yaml", std::string("experiment: \"caf\xc3\xa9 \xe2\x98\x95\"\n"));
  save("config", "overlong.yaml", std::string("aa: rand-m9-`\xc0\xae-mstd0.5\n"));
}

void class_map_seeds() {
  save("class_map", "plain.txt", std::string("cat\ndog\nbird\n"));
  save("class_map", "crlf.txt", std::string("  n01440764 \r\nn01443537\r\n\r\n\n"));
  save("class_map", "one.txt", std::string("only"));
}

// JPEG through libjpeg directly: progressive, CMYK (Adobe), restart markers, 4:4:4.
Bytes jpeg_raw(const Image& img, J_COLOR_SPACE space, bool progressive, int restart, bool sub444) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr jerr;
  cinfo.err = jpeg_std_error(&jerr);
  jpeg_create_compress(&cinfo);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buf, &size);
  cinfo.image_width = JDIMENSION(img.w);
  cinfo.image_height = JDIMENSION(img.h);
  cinfo.input_components = img.c;
  cinfo.in_color_space = space;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, 80, TRUE);
  if (progressive) jpeg_simple_progression(&cinfo);
  cinfo.restart_interval = JDIMENSION(restart);
  if (sub444)
    for (int i = 0; i < cinfo.num_components; ++i)
      cinfo.comp_info[i].h_samp_factor = cinfo.comp_info[i].v_samp_factor = 1;
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row =
        const_cast<uint8_t*>(img.px.data()) + size_t(cinfo.next_scanline) * img.w * img.c;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  Bytes out(buf, buf + size);
  std::free(buf);
  return out;
}

void jpeg_seeds() {
  save("jpeg", "rgb.jpg", vit::data::encode_jpeg(pattern(12, 17, 3), 75));
  save("jpeg", "gray.jpg", vit::data::encode_jpeg(pattern(9, 8, 1), 75));
  save("jpeg", "progressive.jpg", jpeg_raw(pattern(16, 16, 3), JCS_RGB, true, 0, false));
  save("jpeg", "cmyk.jpg", jpeg_raw(pattern(8, 16, 4), JCS_CMYK, false, 0, false));
  save("jpeg", "restart444.jpg", jpeg_raw(pattern(24, 10, 3), JCS_RGB, false, 1, true));
}

// PNG through libpng directly, for colour types / depths / interlacing encode_png never writes.
Bytes png_raw(int w, int h, int color, int depth, bool interlace, const Bytes& data,
              const std::vector<png_color>* palette = nullptr, const Bytes* trns = nullptr) {
  Bytes out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) std::abort();
  png_set_write_fn(
      png, &out,
      [](png_structp p, png_bytep d, png_size_t n) {
        auto* o = static_cast<Bytes*>(png_get_io_ptr(p));
        o->insert(o->end(), d, d + n);
      },
      [](png_structp) {});
  png_set_IHDR(png, info, png_uint_32(w), png_uint_32(h), depth, color,
               interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (palette) png_set_PLTE(png, info, palette->data(), int(palette->size()));
  if (trns) png_set_tRNS(png, info, trns->data(), int(trns->size()), nullptr);
  png_write_info(png, info);
  if (interlace) png_set_interlace_handling(png);
  const size_t rowbytes = png_get_rowbytes(png, info);
  std::vector<png_bytep> rows(static_cast<size_t>(h));
  for (int y = 0; y < h; ++y)
    rows[size_t(y)] = const_cast<uint8_t*>(data.data()) + size_t(y) * rowbytes;
  png_write_image(png, rows.data());
  png_write_end(png, info);
  png_destroy_write_struct(&png, &info);
  return out;
}

void png_seeds() {
  save("png", "rgb.png", vit::data::encode_png(pattern(7, 9, 3)));
  save("png", "gray.png", vit::data::encode_png(pattern(5, 4, 1)));
  save("png", "rgba.png", vit::data::encode_png(pattern(4, 6, 4)));
  const std::vector<png_color> pal = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {9, 9, 9}};
  const Bytes trns = {0, 128};
  Bytes idx(4 * 3);
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = uint8_t(i % 4);
  save("png", "palette_trns.png",
       png_raw(4, 3, PNG_COLOR_TYPE_PALETTE, 8, false, idx, &pal, &trns));
  Bytes rgb16(3 * 5 * 6);
  for (size_t i = 0; i < rgb16.size(); ++i) rgb16[i] = uint8_t(i * 13);
  save("png", "rgb16_adam7.png", png_raw(5, 3, PNG_COLOR_TYPE_RGB, 16, true, rgb16));
  save("png", "gray1.png", png_raw(12, 2, PNG_COLOR_TYPE_GRAY, 1, false, {0xA5, 0x50, 0x0F, 0xF0}));
  Bytes ga(4 * 4 * 2);
  for (size_t i = 0; i < ga.size(); ++i) ga[i] = uint8_t(i * 29);
  save("png", "gray_alpha.png", png_raw(4, 4, PNG_COLOR_TYPE_GRAY_ALPHA, 8, false, ga));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_corpus OUT_DIR\n");
    return 2;
  }
  g_out = argv[1];
  const fs::path tmp = fs::temp_directory_path() / ("vit_make_corpus_" + std::to_string(getpid()));
  fs::create_directories(tmp);
  try {
    safetensors_seeds(tmp);
    idx_seeds(tmp);
    npy_seeds(tmp);
    cifar_seeds();
    packed_seeds(tmp);
    config_seeds();
    class_map_seeds();
    jpeg_seeds();
    png_seeds();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_corpus: %s\n", e.what());
    fs::remove_all(tmp);
    return 1;
  }
  fs::remove_all(tmp);
  return 0;
}
