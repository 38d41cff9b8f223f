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
  std::size_t features = 0;   // 28 * 28
  std::vector<float> images;  // size x features, normalized (x - mean) / std
  std::vector<std::uint8_t> labels;
};

// Reads <dir>/<prefix>-images-idx3-ubyte.gz and <dir>/<prefix>-labels-idx1-ubyte.gz
// (prefix "train" or "t10k"), keeping at most `limit` samples (0: all).
// Throws std::runtime_error naming the file on a missing or malformed file.
Dataset load_fashion_mnist(const std::string& dir, const std::string& prefix,
                           std::size_t limit = 0);

}  // namespace ddp::examples
