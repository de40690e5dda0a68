// The Tensor container: construction, checked access, reshape, comparisons.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/ops.h"
#include "attn/tensor.h"
#include "expect.h"

using attn::Shape;
using attn::Tensor;

TEST(Tensor, ShapeAndValues) {
  Tensor t = Tensor::of({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(t.dim(), 2);
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.size(-1), 3);
  EXPECT_EQ(t.at({1, 2}), 6.0f);
  EXPECT_EQ(t[4], 5.0f);
  EXPECT_EQ(attn::shape_str(t.shape()), "(2, 3)");
  EXPECT_EQ(attn::shape_str({5}), "(5,)");
}

TEST(Tensor, CheckedAccessNamesTheValues) {
  Tensor t({2, 3});
  try {
    t.at({2, 0});
    FAIL() << "expected std::out_of_range";
  } catch (const std::out_of_range& e) {
    EXPECT_STREQ(e.what(), "Tensor::at: index 2 out of range for dim 0 of shape (2, 3)");
  }
  EXPECT_THROW(t[6], std::out_of_range);
  EXPECT_THROW(t.size(2), std::out_of_range);
  EXPECT_THROW(Tensor({2, 2}, std::vector<float>{1, 2, 3}), std::invalid_argument);
}

TEST(Tensor, Reshape) {
  Tensor t = Tensor::arange(12);
  Tensor r = t.reshape({3, -1});
  EXPECT_EQ(r.shape(), (attn::Shape{3, 4}));
  EXPECT_EQ(r.at({2, 1}), 9.0f);
  try {
    t.reshape({5, -1});
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "reshape: shape (5, -1) is invalid for input of size 12");
  }
}

TEST(Tensor, Comparisons) {
  Tensor a = Tensor::of({3}, {1.0f, 2.0f, NAN});
  Tensor b = Tensor::of({3}, {1.0f, 2.5f, NAN});
  EXPECT_FLOAT_EQ(attn::max_abs_diff(a, b), 0.5f);
  EXPECT_TRUE(attn::has_non_finite(a));
  EXPECT_FALSE(attn::allclose(a, b));
  EXPECT_TRUE(attn::allclose(Tensor::of({1}, {1.0f}), Tensor::of({1}, {1.000001f})));
}

// ---- shared storage, views, dtypes -------------------------------------------------------

using attn::test::expect_message;

TEST(Tensor, CopiesAreHandlesAndCloneCopiesValues) {
  Tensor a = Tensor::arange(4);
  Tensor b = a;  // the same storage
  b[1] = 10.0f;
  EXPECT_EQ(a[1], 10.0f);
  EXPECT_TRUE(b.shares_storage_with(a));
  EXPECT_EQ(a.storage_use_count(), 2);
  Tensor c = a.clone();
  c[2] = -1.0f;
  EXPECT_EQ(a[2], 2.0f);
  EXPECT_FALSE(c.shares_storage_with(a));
}

TEST(Tensor, ViewsShareStorageAndWritesGoThrough) {
  Tensor x = Tensor::arange(12).view({3, 4});
  Tensor col = x.slice(1, 1, 3);  // (3, 2), strides (4, 1), offset 1
  EXPECT_EQ(col.strides(), (Shape{4, 1}));
  EXPECT_EQ(col.storage_offset(), 1);
  EXPECT_FALSE(col.is_contiguous());
  col.fill_(0.0f);
  EXPECT_EQ(x.to_vector(), (std::vector<float>{0, 0, 0, 3, 4, 0, 0, 7, 8, 0, 0, 11}));
  Tensor xt = x.transpose(0, 1);  // (4, 3)
  xt.at({3, 2}) = 99.0f;
  EXPECT_EQ(x.at({2, 3}), 99.0f);
  Tensor row = x.select(0, 1);  // (4,), contiguous
  EXPECT_TRUE(row.is_contiguous());
  row += Tensor::ones({4});
  EXPECT_EQ(x.select(0, 1).to_vector(), (std::vector<float>{5, 1, 1, 8}));
  // += through a strided view writes through its strides.
  Tensor c0 = x.select(1, 0);  // (3,), stride 4
  c0 += Tensor::full({3}, 100.0f);
  EXPECT_EQ(x.select(1, 0).to_vector(), (std::vector<float>{100, 105, 108}));
  EXPECT_EQ(x.at({1, 1}), 1.0f);
}

TEST(Tensor, ReshapeViewsWhenTheLayoutAllowsAndCopiesOtherwise) {
  const Tensor x = Tensor::arange(24).view({2, 3, 4});
  EXPECT_TRUE(x.reshape({6, 4}).shares_storage_with(x));
  const Tensor p = x.permute({2, 0, 1});  // (4, 2, 3)
  EXPECT_TRUE(p.reshape({4, 6}).shares_storage_with(x));  // dims 1, 2 still one block
  EXPECT_FALSE(p.reshape({24}).shares_storage_with(x));
  EXPECT_EQ(p.reshape({24}).to_vector(), p.to_vector());
  EXPECT_TRUE(p.reshape({2, 2, 2, 3}).shares_storage_with(x));  // splits one dim only
  expect_message<std::invalid_argument>(
      [&] { (void)p.view({24}); },
      "view: a tensor of shape (4, 2, 3) with strides (1, 12, 4) cannot be viewed as (24,); use "
      "reshape (it copies)");
  expect_message<std::invalid_argument>([&] { (void)x.permute({0, 0, 1}); },
                                        "permute: dim 0 repeats in (0, 0, 1) (shape (2, 3, 4))");
}

TEST(Tensor, RawAccessRefusesStridedViewsAndOtherDtypes) {
  const Tensor x = Tensor::arange(6).view({2, 3});
  expect_message<std::logic_error>(
      [&] { (void)x.transpose(0, 1).data(); },
      "Tensor::data: the tensor of shape (3, 2) with strides (1, 3) is not contiguous; call "
      "contiguous() first");
  EXPECT_EQ(x.transpose(0, 1).contiguous().to_vector(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  const Tensor ids = Tensor::from_int64({3}, {7, 8, 9});
  expect_message<std::logic_error>([&] { (void)ids.data(); },
                                   "Tensor::data: the tensor is int64, not float32; convert it with to()");
  expect_message<std::invalid_argument>(
      [&] { (void)attn::add(x.to(attn::DType::kBFloat16), x); },
      "add: expected a float32 tensor, got bfloat16 of shape (2, 3); convert it with "
      "to(DType::kFloat32)");
}

TEST(Tensor, DtypesConvertAsPyTorchCasts) {
  using attn::DType;
  const Tensor ids = Tensor::from_int64({2, 2}, {1, -2, 50256, 3});
  EXPECT_EQ(ids.dtype(), DType::kInt64);
  EXPECT_EQ(ids.to_int64_vector(), (std::vector<int64_t>{1, -2, 50256, 3}));
  EXPECT_EQ(ids.to(DType::kFloat32).to_vector(), (std::vector<float>{1, -2, 50256, 3}));
  // float -> int64 truncates toward zero.
  EXPECT_EQ(Tensor::of({4}, {1.9f, -1.9f, 0.5f, -0.0f}).to(DType::kInt64).to_int64_vector(),
            (std::vector<int64_t>{1, -1, 0, 0}));
  // float -> bfloat16 rounds to nearest, ties to even; 1 + 2^-8 is a tie.
  const Tensor bf = Tensor::of({3}, {1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 3.14159f}).to(DType::kBFloat16);
  EXPECT_EQ(bf.to_vector(), (std::vector<float>{1.0f, 1.015625f, 3.140625f}));
  EXPECT_EQ(bf.select(0, 2).item(), 3.140625f);
  EXPECT_EQ(attn::element_size(DType::kBFloat16), 2);
  EXPECT_EQ(attn::to_bfloat16(std::numeric_limits<float>::quiet_NaN()).bits, 0xFFFF);
  EXPECT_EQ(attn::to_bfloat16(3.4028235e38f).bits, 0x7F80);  // rounds up to inf
}

TEST(Tensor, CopyBetweenOverlappingViewsReadsBeforeWriting) {
  Tensor x = Tensor::arange(6);
  x.slice(0, 1, 6).copy_(x.slice(0, 0, 5));  // shift right by one
  EXPECT_EQ(x.to_vector(), (std::vector<float>{0, 0, 1, 2, 3, 4}));
  Tensor m = Tensor::arange(4).view({2, 2});
  m.copy_(m.transpose(0, 1));
  EXPECT_EQ(m.to_vector(), (std::vector<float>{0, 2, 1, 3}));
  expect_message<std::invalid_argument>([&] { m.copy_(Tensor({3})); },
                                        "copy_: source of shape (3,) does not match destination of shape (2, 2)");
}

TEST(Tensor, StorageIsAlignedForSimd) {
  for (int64_t n : {1, 3, 17, 1000}) {
    const Tensor t({n});
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u) << n;
  }
}

// ---- the storage cache ----------------------------------------------------------------

namespace {
// Restores the process's cache limit when a test ends.
struct CacheLimitGuard {
  int64_t limit = attn::storage_cache_stats().limit_bytes;
  ~CacheLimitGuard() { attn::set_storage_cache_limit(limit); }
};
constexpr int64_t kLarge = 3 << 20;  // 3 MiB: a cached size
}  // namespace

TEST(StorageCache, AFreedLargeBlockServesTheNextStorageOfItsSize) {
  CacheLimitGuard guard;
  attn::set_storage_cache_limit(int64_t{64} << 20);
  attn::release_cached_storage();
  const float* first = nullptr;
  {
    Tensor t = Tensor::full({kLarge / 4}, 7.0f);
    first = t.data();
  }
  const auto before = attn::storage_cache_stats();
  EXPECT_EQ(before.cached_blocks, 1);
  EXPECT_EQ(before.cached_bytes, kLarge);
  // zeros() on the reused block is all zeros: the old 7s do not come back.
  Tensor z = Tensor::zeros({kLarge / 4});
  const auto after = attn::storage_cache_stats();
  EXPECT_EQ(z.data(), first);
  EXPECT_EQ(after.hits, before.hits + 1);
  EXPECT_EQ(after.cached_blocks, 0);
  for (int64_t i = 0; i < z.numel(); ++i) ASSERT_EQ(z[i], 0.0f) << i;
  // A different size misses, and small storages never enter the cache.
  Tensor other = Tensor::zeros({kLarge / 4 + 4096});
  EXPECT_NE(other.data(), first);
  EXPECT_EQ(attn::storage_cache_stats().misses, after.misses + 1);
  { Tensor small({1000}); }
  EXPECT_EQ(attn::storage_cache_stats().cached_blocks, 0);
}

TEST(StorageCache, TheLimitReleasesTheOldestBlocksFirst) {
  CacheLimitGuard guard;
  attn::set_storage_cache_limit(2 * kLarge);
  attn::release_cached_storage();
  const float* a_data = nullptr;
  const float* c_data = nullptr;
  {
    Tensor a({kLarge / 4}), b({kLarge / 4}), c({kLarge / 4});
    a_data = a.data();
    c_data = c.data();
  }  // freed c, b, a (in reverse order of declaration): c is the oldest
  EXPECT_EQ(attn::storage_cache_stats().cached_bytes, 2 * kLarge);
  Tensor x({kLarge / 4}), y({kLarge / 4});
  EXPECT_TRUE(x.data() != c_data && y.data() != c_data);
  EXPECT_TRUE(x.data() == a_data || y.data() == a_data);
  // Limit 0 turns the cache off and releases everything.
  attn::set_storage_cache_limit(0);
  { Tensor t({kLarge / 4}); }
  EXPECT_EQ(attn::storage_cache_stats().cached_bytes, 0);
  EXPECT_EQ(attn::storage_cache_stats().cached_blocks, 0);
}

TEST(StorageCache, ReleaseEmptiesItAndANegativeLimitIsAnError) {
  CacheLimitGuard guard;
  attn::set_storage_cache_limit(int64_t{64} << 20);
  { Tensor t({kLarge / 4}); }
  EXPECT_GT(attn::storage_cache_stats().cached_bytes, 0);
  attn::release_cached_storage();
  EXPECT_EQ(attn::storage_cache_stats().cached_bytes, 0);
  EXPECT_EQ(attn::storage_cache_stats().limit_bytes, int64_t{64} << 20);
  attn::test::expect_message<std::invalid_argument>(
      [] { attn::set_storage_cache_limit(-1); },
      "set_storage_cache_limit: the limit must be >= 0 bytes, got -1");
}

TEST(Tensor, DtypeNamesRoundTrip) {
  for (const attn::DType d : {attn::DType::kFloat32, attn::DType::kBFloat16, attn::DType::kInt64})
    EXPECT_EQ(attn::dtype_from_name(attn::dtype_name(d)), d);
  attn::test::expect_message<std::invalid_argument>(
      [] { attn::dtype_from_name("float16"); },
      "unknown dtype 'float16' (float32, bfloat16 or int64)");
}
