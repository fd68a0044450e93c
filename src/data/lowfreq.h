// Low-frequency cropping of float images stored as C planes of S x S pixels, (C, S, S) row-major,
// output (C, Bsz, Bsz). methods.md §2.2 (EfficientTrain FFT crop) and §2.3 (ET++ down-sampling).
// Both functions are thread-safe and may run concurrently on different buffers.
#pragma once

namespace vit {

// EfficientTrain's spectral crop, per channel:
//   F = fft2(x) (unshifted, S x S); b = Bsz / 2;
//   G (Bsz x Bsz) = the four corner blocks F[:b,:b], F[-b:,:b], F[:b,-b:], F[-b:,-b:]
//                   (frequencies -b..b-1 on both axes), placed at the same corners of G;
//   y = Re(ifft2(G * (Bsz / S)^2)).
// The scale keeps each channel's mean (DC) unchanged. Requires Bsz even, 2 <= Bsz <= S, C >= 1.
// in: (C, S, S); out: (C, Bsz, Bsz); in and out must not overlap. Throws vit::Error.
// Uses FFTW (single precision); plans are created once per size under a mutex and cached.
void fft_lowfreq_crop(const float* in, int C, int S, float* out, int Bsz);

// Antialiased bilinear down-sampling with torch.nn.functional.interpolate(mode='bilinear',
// antialias=True, align_corners=False) semantics: separable triangle filter whose support grows
// with the down-scale factor S / Bsz, weights normalised per output pixel. Requires
// 1 <= Bsz <= S, C >= 1. in: (C, S, S); out: (C, Bsz, Bsz), not overlapping. Throws vit::Error.
void antialias_downsample(const float* in, int C, int S, float* out, int Bsz);

}  // namespace vit
