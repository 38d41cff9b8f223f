#include "fashion_mnist.h"

#include <zlib.h>

#include <memory>
#include <stdexcept>

namespace ddp::examples {
namespace {

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzPtr = std::unique_ptr<gzFile_s, GzCloser>;

std::uint32_t read_be32(gzFile f, const std::string& path) {
  unsigned char b[4];
  if (gzread(f, b, 4) != 4) throw std::runtime_error(path + ": truncated header");
  return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) |
         b[3];
}

std::vector<std::uint8_t> read_idx(const std::string& path, std::uint32_t magic,
                                   std::vector<std::uint32_t>& dims, std::size_t limit) {
  GzPtr f(gzopen(path.c_str(), "rb"));
  if (!f) throw std::runtime_error(path + ": cannot open (is dataset-fashion-mnist installed?)");
  if (read_be32(f.get(), path) != magic)
    throw std::runtime_error(path + ": not an IDX file of the expected kind");
  const std::uint32_t ndim = magic & 0xff;
  dims.clear();
  std::size_t per_item = 1;
  for (std::uint32_t d = 0; d < ndim; ++d) {
    dims.push_back(read_be32(f.get(), path));
    if (d > 0) per_item *= dims.back();
  }
  std::size_t items = dims[0];
  if (limit != 0 && limit < items) items = limit;
  dims[0] = static_cast<std::uint32_t>(items);
  std::vector<std::uint8_t> data(items * per_item);
  std::size_t done = 0;
  while (done < data.size()) {
    const auto chunk = static_cast<unsigned>(std::min<std::size_t>(data.size() - done, 1u << 30));
    const int n = gzread(f.get(), data.data() + done, chunk);
    if (n <= 0) throw std::runtime_error(path + ": truncated data");
    done += static_cast<std::size_t>(n);
  }
  return data;
}

}  // namespace

Dataset load_fashion_mnist(const std::string& dir, const std::string& prefix, std::size_t limit) {
  std::vector<std::uint32_t> image_dims, label_dims;
  const std::string images_path = dir + "/" + prefix + "-images-idx3-ubyte.gz";
  const std::string labels_path = dir + "/" + prefix + "-labels-idx1-ubyte.gz";
  auto pixels = read_idx(images_path, 0x00000803, image_dims, limit);
  auto labels = read_idx(labels_path, 0x00000801, label_dims, limit);
  if (image_dims[0] != label_dims[0]) {
    throw std::runtime_error(images_path + " and " + labels_path +
                             " hold different numbers of samples");
  }
  Dataset ds;
  ds.size = image_dims[0];
  ds.features = static_cast<std::size_t>(image_dims[1]) * image_dims[2];
  ds.pixels = std::move(pixels);
  ds.labels = std::move(labels);
  for (auto l : ds.labels) {
    if (l > 9) throw std::runtime_error(labels_path + ": label out of range");
  }
  return ds;
}

void Dataset::normalized(std::size_t first, std::size_t count, float* out) const {
  // Fashion-MNIST's training-set pixel mean and standard deviation.
  constexpr float kMean = 0.2860f, kStd = 0.3530f;
  const std::uint8_t* in = &pixels[first * features];
  for (std::size_t i = 0; i < count * features; ++i) {
    out[i] = (static_cast<float>(in[i]) / 255.0f - kMean) / kStd;
  }
}

}  // namespace ddp::examples
