// Fashion-MNIST from gzip-compressed IDX files (the dataset-fashion-mnist
// package installs them under /usr/share/datasets/fashion-mnist).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp::examples {

struct Dataset {
  std::size_t size = 0;
  std::size_t features = 0;          // 28 * 28
  std::vector<std::uint8_t> pixels;  // size x features, as stored
  std::vector<std::uint8_t> labels;

  // The model's input for samples [first, first + count): their pixels as
  // floats, normalized (x / 255 - mean) / std, count x features at `out`.
  // Normalized a batch at a time rather than once for the whole set: 60,000
  // images as floats are 188 MB of fresh memory, whose first touch cost about
  // a second on this project's VM before the first step (a joining node's too).
  void normalized(std::size_t first, std::size_t count, float* out) const;
};

// Reads <dir>/<prefix>-images-idx3-ubyte.gz and <dir>/<prefix>-labels-idx1-ubyte.gz
// (prefix "train" or "t10k"), keeping at most `limit` samples (0: all).
// Throws std::runtime_error naming the file on a missing or malformed file.
Dataset load_fashion_mnist(const std::string& dir, const std::string& prefix,
                           std::size_t limit = 0);

}  // namespace ddp::examples
