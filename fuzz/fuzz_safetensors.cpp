// libFuzzer target: the safetensors reader (io/safetensors.h), then the float conversion of
// every floating-point tensor it accepts.
#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static vit::fuzz::MemFile file("safetensors");
  file.set(data, size);
  return vit::fuzz::expect_value_or_error([&] {
    const vit::io::SafeTensors st = vit::io::read_safetensors(file.path());
    for (const auto& t : st.tensors)
      if (t.dtype == vit::io::DType::F32 || t.dtype == vit::io::DType::F64 ||
          t.dtype == vit::io::DType::BF16 || t.dtype == vit::io::DType::F16)
        (void)t.to_f32();
  });
}
