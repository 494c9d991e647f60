// Run-time compiled kernels (src/cuda/kernels.cu): NVRTC, loaded with dlopen from the
// CUDA wheel's libnvrtc, compiles the source for the device's architecture once per
// process and device; the driver API (through the runtime's entry-point query, so no
// link against libcuda) loads the image and launches on the caller's current c10 stream.
//
// Each op returns 0 when it ran (its output written to `*out`, a new torch::Tensor*),
// 1 when it does not apply to these inputs (the caller runs the ATen chain instead), and
// a negative code on failure (text in dflash_cuda_last_error). None throws.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nvrtc.h>
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/types.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {
thread_local char kernel_error[512] = {0};

int fail(const std::string& msg) {
  std::strncpy(kernel_error, msg.c_str(), sizeof(kernel_error) - 1);
  kernel_error[sizeof(kernel_error) - 1] = 0;
  return -1;
}

struct Nvrtc {
  decltype(&nvrtcCreateProgram) create = nullptr;
  decltype(&nvrtcCompileProgram) compile = nullptr;
  decltype(&nvrtcGetProgramLogSize) log_size = nullptr;
  decltype(&nvrtcGetProgramLog) log = nullptr;
  decltype(&nvrtcGetCUBINSize) cubin_size = nullptr;
  decltype(&nvrtcGetCUBIN) cubin = nullptr;
  decltype(&nvrtcDestroyProgram) destroy = nullptr;
  decltype(&nvrtcGetErrorString) error_string = nullptr;
  std::string load_error;
};

const Nvrtc& nvrtc() {
  static Nvrtc n = [] {
    Nvrtc n;
    void* lib = dlopen("libnvrtc.so.13", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* e = dlerror();
      n.load_error = std::string("cannot load libnvrtc.so.13: ") + (e ? e : "unknown error");
      return n;
    }
#define SYM(field, name)                                                   \
  n.field = reinterpret_cast<decltype(n.field)>(dlsym(lib, name));         \
  if (n.field == nullptr) {                                                \
    n.load_error = std::string("libnvrtc.so.13 lacks ") + name;            \
    return n;                                                              \
  }
    SYM(create, "nvrtcCreateProgram")
    SYM(compile, "nvrtcCompileProgram")
    SYM(log_size, "nvrtcGetProgramLogSize")
    SYM(log, "nvrtcGetProgramLog")
    SYM(cubin_size, "nvrtcGetCUBINSize")
    SYM(cubin, "nvrtcGetCUBIN")
    SYM(destroy, "nvrtcDestroyProgram")
    SYM(error_string, "nvrtcGetErrorString")
#undef SYM
    // NVRTC dlopens its builtins library by name at the first compile, searching only
    // LD_LIBRARY_PATH and the system paths; the wheel keeps it beside libnvrtc, so load
    // it from there first (a later dlopen by the same name finds it loaded).
    Dl_info info;
    if (dladdr(reinterpret_cast<void*>(n.create), &info) != 0 && info.dli_fname != nullptr) {
      std::string dir(info.dli_fname);
      dir = dir.substr(0, dir.find_last_of('/') + 1);
      dlopen((dir + "libnvrtc-builtins.so.13.0").c_str(), RTLD_NOW | RTLD_GLOBAL);
    }
    return n;
  }();
  return n;
}

// Compiles `src` to a cubin for sm_<major><minor>. Returns 0 or -1 (message set).
int compile(const char* src, int major, int minor, std::vector<char>* image) {
  const Nvrtc& n = nvrtc();
  if (!n.load_error.empty()) return fail(n.load_error);
  nvrtcProgram prog;
  nvrtcResult r = n.create(&prog, src, "dflash_kernels.cu", 0, nullptr, nullptr);
  if (r != NVRTC_SUCCESS) return fail(std::string("nvrtcCreateProgram: ") + n.error_string(r));
  std::string arch = "--gpu-architecture=sm_" + std::to_string(major) + std::to_string(minor);
  const char* opts[] = {arch.c_str(), "--std=c++17"};
  r = n.compile(prog, 2, opts);
  if (r != NVRTC_SUCCESS) {
    size_t len = 0;
    n.log_size(prog, &len);
    std::string log(len, '\0');
    if (len > 0) n.log(prog, &log[0]);
    n.destroy(&prog);
    return fail(std::string("NVRTC could not compile the kernels for ") + arch.substr(19) + ": " +
                n.error_string(r) + ": " + log);
  }
  size_t size = 0;
  n.cubin_size(prog, &size);
  image->resize(size);
  n.cubin(prog, image->data());
  n.destroy(&prog);
  return 0;
}

struct Driver {
  decltype(&cuModuleLoadData) load = nullptr;
  decltype(&cuModuleGetFunction) get_function = nullptr;
  decltype(&cuLaunchKernel) launch = nullptr;
  decltype(&cuGetErrorString) error_string = nullptr;
  std::string load_error;
};

const Driver& driver() {
  static Driver d = [] {
    Driver d;
    auto get = [&](const char* name, void** fn) {
      cudaDriverEntryPointQueryResult status;
      if (cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &status) != cudaSuccess ||
          status != cudaDriverEntryPointSuccess || *fn == nullptr) {
        cudaGetLastError();
        d.load_error = std::string("the CUDA driver lacks ") + name;
        return false;
      }
      return true;
    };
    void* fn = nullptr;
    if (!get("cuModuleLoadData", &fn)) return d;
    d.load = reinterpret_cast<decltype(d.load)>(fn);
    if (!get("cuModuleGetFunction", &fn)) return d;
    d.get_function = reinterpret_cast<decltype(d.get_function)>(fn);
    if (!get("cuLaunchKernel", &fn)) return d;
    d.launch = reinterpret_cast<decltype(d.launch)>(fn);
    if (!get("cuGetErrorString", &fn)) return d;
    d.error_string = reinterpret_cast<decltype(d.error_string)>(fn);
    return d;
  }();
  return d;
}

std::string cu_error(CUresult r) {
  const char* s = nullptr;
  if (driver().error_string != nullptr) driver().error_string(r, &s);
  return s ? s : ("CUresult " + std::to_string(static_cast<int>(r)));
}

enum Kernel {
  NORM_ROPE_C2,
  NORM_ROPE_C4,
  NORM_ROPE_C8,
  NORM_ROPE_BWD_C2,
  NORM_ROPE_BWD_C4,
  NORM_ROPE_BWD_C8,
  ADD_RMS_NORM,
  SILU_MUL,
  SILU_MUL_BWD,
  SOFTMAX_XENT,
  KERNEL_COUNT
};
const char* kernel_names[KERNEL_COUNT] = {"norm_rope_c2",     "norm_rope_c4",     "norm_rope_c8",
                                          "norm_rope_bwd_c2", "norm_rope_bwd_c4", "norm_rope_bwd_c8",
                                          "add_rms_norm",     "silu_mul",         "silu_mul_bwd",
                                          "softmax_xent"};

struct Module {
  CUfunction fn[KERNEL_COUNT] = {};
};

std::mutex modules_mutex;
std::string kernel_source;                // set once by dflash_kernels_load
std::map<int, Module> modules;            // per device
std::map<int, std::string> module_errors;  // per device: why it could not be built

// The module of `device`, compiled and loaded on first use; null with the reason set.
const Module* module_for(int device) {
  std::lock_guard<std::mutex> lock(modules_mutex);
  auto it = modules.find(device);
  if (it != modules.end()) return &it->second;
  auto err = module_errors.find(device);
  if (err != module_errors.end()) {
    fail(err->second);
    return nullptr;
  }
  auto give_up = [&](const std::string& why) -> const Module* {
    module_errors[device] = why;
    fail(why);
    return nullptr;
  };
  if (kernel_source.empty()) return give_up("the kernel source was not handed to the shim");
  const Driver& d = driver();
  if (!d.load_error.empty()) return give_up(d.load_error);
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return give_up("cannot read the properties of CUDA device " + std::to_string(device));
  }
  std::vector<char> image;
  if (compile(kernel_source.c_str(), prop.major, prop.minor, &image) != 0) return give_up(kernel_error);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  cudaFree(nullptr);  // the device's primary context exists and is current
  CUmodule mod;
  CUresult r = d.load(&mod, image.data());
  if (r != CUDA_SUCCESS) return give_up("cuModuleLoadData: " + cu_error(r));
  Module m;
  for (int k = 0; k < KERNEL_COUNT; ++k) {
    r = d.get_function(&m.fn[k], mod, kernel_names[k]);
    if (r != CUDA_SUCCESS) return give_up(std::string("cuModuleGetFunction ") + kernel_names[k] + ": " + cu_error(r));
  }
  return &(modules[device] = m);
}

int launch(int device, Kernel k, unsigned grid, unsigned block, void** args) {
  const Module* m = module_for(device);
  if (m == nullptr) return -1;
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
  CUresult r = driver().launch(m->fn[k], grid, 1, 1, block, 1, 1, 0, stream, args, nullptr);
  if (r != CUDA_SUCCESS) return fail(std::string("launching ") + kernel_names[k] + ": " + cu_error(r));
  return 0;
}

bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// The kernels serve bf16 CUDA tensors of one device.
bool serves(std::initializer_list<const at::Tensor*> ts) {
  const at::Tensor* first = *ts.begin();
  if (!first->is_cuda()) return false;
  for (const at::Tensor* t : ts) {
    if (!t->defined() || !t->is_cuda() || t->scalar_type() != at::kBFloat16 ||
        t->device() != first->device() || !aligned16(*t))
      return false;
  }
  return true;
}

bool needs_grad(std::initializer_list<const at::Tensor*> ts) {
  if (!at::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : ts)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

// The fused path without a backward: bf16 CUDA tensors of one device, outside autograd.
bool applies(std::initializer_list<const at::Tensor*> ts) { return serves(ts) && !needs_grad(ts); }

constexpr unsigned WARPS_PER_BLOCK = 4;

unsigned blocks_for_rows(int64_t rows) {
  return static_cast<unsigned>((rows + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK);
}
}  // namespace

#define KERNEL_TRY(...)                           \
  try {                                           \
    __VA_ARGS__                                   \
  } catch (const std::exception& e) {             \
    return fail(e.what());                        \
  } catch (...) {                                 \
    return fail("unknown C++ exception");         \
  }

extern "C" {

const char* dflash_kernels_last_error() { return kernel_error; }

// Hands the kernel source to the shim (once; later calls are ignored).
void dflash_kernels_set_source(const char* src, size_t len) {
  std::lock_guard<std::mutex> lock(modules_mutex);
  if (kernel_source.empty()) kernel_source.assign(src, len);
}

// Compiles `src` for sm_<major><minor> without a device and checks that the image names
// every kernel of kernel_names; writes the cubin's size.
int dflash_kernels_compile(const char* src, size_t len, int major, int minor, size_t* size) {
  KERNEL_TRY({
    std::string s(src, len);
    std::vector<char> image;
    if (compile(s.c_str(), major, minor, &image) != 0) return -1;
    // every kernel the launcher looks up is in the image's symbol names
    for (const char* name : kernel_names) {
      std::string sym(name, std::strlen(name) + 1);  // with its terminating NUL
      if (std::search(image.begin(), image.end(), sym.begin(), sym.end()) == image.end())
        return fail(std::string("the compiled image has no kernel ") + name);
    }
    *size = image.size();
    return 0;
  })
}

// Compiles and loads the kernels for `device` now (not at the first launch).
int dflash_kernels_prepare(int device) {
  KERNEL_TRY({ return module_for(device) != nullptr ? 0 : -1; })
}

}  // extern "C"

namespace {
// The layouts norm_rope serves: x [B, L, heads, D] contiguous, D in {64, 128, 256}; cos,
// sin [B, L, 1, D] with D contiguous and 16-byte aligned rows; weight [D] contiguous.
bool norm_rope_layout(const at::Tensor& x, const at::Tensor* w, const at::Tensor& c, const at::Tensor& s) {
  if (!(w ? serves({&x, &c, &s, w}) : serves({&x, &c, &s}))) return false;
  if (x.dim() != 4 || c.dim() != 4 || s.dim() != 4 || !x.is_contiguous()) return false;
  const int64_t b = x.size(0), l = x.size(1), d = x.size(3);
  if (d != 64 && d != 128 && d != 256) return false;
  for (const at::Tensor* t : {&c, &s}) {
    if (t->size(0) != b || t->size(1) != l || t->size(2) != 1 || t->size(3) != d || t->stride(3) != 1 ||
        t->stride(1) != c.stride(1) || t->stride(1) % 8 != 0 ||
        (b > 1 && (t->stride(0) != c.stride(0) || t->stride(0) % 8 != 0)))
      return false;
  }
  return !w || (w->dim() == 1 && w->size(0) == d && w->is_contiguous());
}

Kernel by_width(int64_t d, Kernel c2, Kernel c4, Kernel c8) { return d == 64 ? c2 : d == 128 ? c4 : c8; }

// Runs norm_rope on a layout norm_rope_layout accepted; 0 or a negative code.
int norm_rope_run(const at::Tensor& x, const at::Tensor* w, const at::Tensor& c, const at::Tensor& s, double eps,
                  at::Tensor* out) {
  const int64_t b = x.size(0), l = x.size(1), heads = x.size(2), d = x.size(3);
  c10::cuda::CUDAGuard guard(x.device());
  auto y = at::empty_like(x);
  if (x.numel() > 0) {
    const void* xp = x.data_ptr();
    void* yp = y.data_ptr();
    const void* wp = w ? w->data_ptr() : nullptr;
    const void* cp = c.data_ptr();
    const void* sp = s.data_ptr();
    long long rows = b * l * heads;
    int h = static_cast<int>(heads);
    long long seq = l, sb = c.stride(0), sl = c.stride(1);
    float e = static_cast<float>(eps);
    void* args[] = {&xp, &yp, &wp, &cp, &sp, &rows, &h, &seq, &sb, &sl, &e};
    Kernel k = by_width(d, NORM_ROPE_C2, NORM_ROPE_C4, NORM_ROPE_C8);
    int rc = launch(x.get_device(), k, blocks_for_rows(rows), WARPS_PER_BLOCK * 32, args);
    if (rc != 0) return rc;
  }
  *out = std::move(y);
  return 0;
}

// norm_rope's backward with a weight: (dx, dw) from dy and the forward's inputs.
int norm_rope_backward_run(const at::Tensor& dy_, const at::Tensor& x, const at::Tensor& w, const at::Tensor& c,
                           const at::Tensor& s, double eps, at::Tensor* dx_out, at::Tensor* dw_out) {
  at::Tensor dy = dy_.to(x.scalar_type()).contiguous();
  if (!aligned16(dy)) dy = dy.clone();
  const int64_t b = x.size(0), l = x.size(1), heads = x.size(2), d = x.size(3);
  c10::cuda::CUDAGuard guard(x.device());
  auto dx = at::empty_like(x);
  auto dw = at::zeros({d}, x.options().dtype(at::kFloat));
  const long long rows = b * l * heads;
  if (rows > 0) {
    const int device = x.get_device();
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0) {
      cudaGetLastError();
      sms = 32;
    }
    constexpr int warps = 8;
    const long long wanted = (rows + warps - 1) / warps;
    const unsigned grid = static_cast<unsigned>(std::min<long long>(wanted, 4ll * sms));
    const void* dyp = dy.data_ptr();
    const void* xp = x.data_ptr();
    const void* wp = w.data_ptr();
    const void* cp = c.data_ptr();
    const void* sp = s.data_ptr();
    void* dxp = dx.data_ptr();
    void* dwp = dw.data_ptr();
    long long n = rows;
    int h = static_cast<int>(heads);
    long long seq = l, sb = c.stride(0), sl = c.stride(1);
    float e = static_cast<float>(eps);
    void* args[] = {&dyp, &xp, &wp, &cp, &sp, &dxp, &dwp, &n, &h, &seq, &sb, &sl, &e};
    Kernel k = by_width(d, NORM_ROPE_BWD_C2, NORM_ROPE_BWD_C4, NORM_ROPE_BWD_C8);
    int rc = launch(device, k, grid, warps * 32, args);
    if (rc != 0) return rc;
  }
  *dx_out = std::move(dx);
  *dw_out = dw.to(w.scalar_type());
  return 0;
}

// rope(rms_norm(x) * w) under autograd: the fused kernel forward and backward.
struct NormRopeFn : public torch::autograd::Function<NormRopeFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor x, at::Tensor w, at::Tensor c,
                            at::Tensor s, double eps) {
    at::Tensor y;
    if (norm_rope_run(x, &w, c, s, eps, &y) != 0) throw std::runtime_error(kernel_error);
    ctx->save_for_backward({x, w});
    ctx->saved_data["cos"] = c;
    ctx->saved_data["sin"] = s;
    ctx->saved_data["eps"] = eps;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    auto saved = ctx->get_saved_variables();
    const at::Tensor c = ctx->saved_data["cos"].toTensor();
    const at::Tensor s = ctx->saved_data["sin"].toTensor();
    const double eps = ctx->saved_data["eps"].toDouble();
    at::Tensor dx, dw;
    if (norm_rope_backward_run(grads[0], saved[0], saved[1], c, s, eps, &dx, &dw) != 0)
      throw std::runtime_error(kernel_error);
    return {dx, dw, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};
// An elementwise kernel over `n8` groups of 8 values, one thread each, `args` ending in n8.
int launch_n8(int device, Kernel k, long long n8, void** args) {
  constexpr unsigned block = 256;
  return launch(device, k, static_cast<unsigned>((n8 + block - 1) / block), block, args);
}

// silu(gate) * up into y (allocated here), gate and up contiguous of one shape with a
// multiple of 8 elements; 0, or an error code with the reason set.
int silu_mul_run(const at::Tensor& g, const at::Tensor& u, at::Tensor* y_out) {
  c10::cuda::CUDAGuard guard(g.device());
  auto y = at::empty_like(g);
  if (g.numel() > 0) {
    const void* gp = g.data_ptr();
    const void* up = u.data_ptr();
    void* yp = y.data_ptr();
    long long n8 = g.numel() / 8;
    void* args[] = {&gp, &up, &yp, &n8};
    int rc = launch_n8(g.get_device(), SILU_MUL, n8, args);
    if (rc != 0) return rc;
  }
  *y_out = std::move(y);
  return 0;
}

// silu(gate) * up under autograd: the fused kernel forward and backward.
struct SiluMulFn : public torch::autograd::Function<SiluMulFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor g, at::Tensor u) {
    at::Tensor y;
    if (silu_mul_run(g, u, &y) != 0) throw std::runtime_error(kernel_error);
    ctx->save_for_backward({g, u});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    auto saved = ctx->get_saved_variables();
    const at::Tensor& g = saved[0];
    const at::Tensor& u = saved[1];
    const at::Tensor dy = grads[0].contiguous();
    c10::cuda::CUDAGuard guard(g.device());
    auto dg = at::empty_like(g);
    auto du = at::empty_like(u);
    if (g.numel() > 0) {
      const void* gp = g.data_ptr();
      const void* up = u.data_ptr();
      const void* dyp = dy.data_ptr();
      void* dgp = dg.data_ptr();
      void* dup = du.data_ptr();
      long long n8 = g.numel() / 8;
      void* args[] = {&gp, &up, &dyp, &dgp, &dup, &n8};
      if (launch_n8(g.get_device(), SILU_MUL_BWD, n8, args) != 0) throw std::runtime_error(kernel_error);
    }
    return {dg, du};
  }
};

}  // namespace

extern "C" {

// y = rope(rms_norm(x) * weight), or rope(x) when weight is null. x: [B, L, heads, D]
// contiguous, D in {64, 128, 256}; cos, sin: [B, L, 1, D] with D contiguous. Under
// autograd (x or the weight requiring a gradient) only with a weight and allow_grad set,
// as a node whose backward is norm_rope_bwd; the tables must not require one.
int dflash_norm_rope(void* x_, void* weight_, void* cos_, void* sin_, double eps, int allow_grad, void** out) {
  KERNEL_TRY({
    const at::Tensor& x = *static_cast<at::Tensor*>(x_);
    const at::Tensor& c = *static_cast<at::Tensor*>(cos_);
    const at::Tensor& s = *static_cast<at::Tensor*>(sin_);
    const at::Tensor* w = weight_ ? static_cast<at::Tensor*>(weight_) : nullptr;
    if (!norm_rope_layout(x, w, c, s)) return 1;
    if (needs_grad({&c, &s})) return 1;
    if (needs_grad({&x}) || (w && needs_grad({w}))) {
      if (!w || !allow_grad) return 1;
      *out = new at::Tensor(NormRopeFn::apply(x, *w, c, s, eps));
      return 0;
    }
    at::Tensor y;
    int rc = norm_rope_run(x, w, c, s, eps, &y);
    if (rc != 0) return rc;
    *out = new at::Tensor(std::move(y));
    return 0;
  })
}

// sum = a + b and normed = rms_norm(sum) * weight over the last dimension (a multiple of
// 8); a, b contiguous of one shape.
int dflash_add_rms_norm(void* a_, void* b_, void* weight_, double eps, void** sum_out, void** norm_out) {
  KERNEL_TRY({
    const at::Tensor& a = *static_cast<at::Tensor*>(a_);
    const at::Tensor& b = *static_cast<at::Tensor*>(b_);
    const at::Tensor& w = *static_cast<at::Tensor*>(weight_);
    if (!applies({&a, &b, &w})) return 1;
    if (a.dim() < 1 || a.sizes() != b.sizes() || !a.is_contiguous() || !b.is_contiguous() ||
        !w.is_contiguous() || w.dim() != 1)
      return 1;
    const int64_t h = a.size(-1);
    if (h % 8 != 0 || w.size(0) != h || h > (int64_t{1} << 30)) return 1;
    c10::cuda::CUDAGuard guard(a.device());
    auto sum = at::empty_like(a);
    auto normed = at::empty_like(a);
    if (a.numel() > 0) {
      const void* ap = a.data_ptr();
      const void* bp = b.data_ptr();
      void* sp = sum.data_ptr();
      void* yp = normed.data_ptr();
      const void* wp = w.data_ptr();
      long long rows = a.numel() / h;
      int hh = static_cast<int>(h);
      float e = static_cast<float>(eps);
      void* args[] = {&ap, &bp, &sp, &yp, &wp, &rows, &hh, &e};
      int rc = launch(a.get_device(), ADD_RMS_NORM, blocks_for_rows(rows), WARPS_PER_BLOCK * 32, args);
      if (rc != 0) return rc;
    }
    *sum_out = new at::Tensor(std::move(sum));
    *norm_out = new at::Tensor(std::move(normed));
    return 0;
  })
}

// silu(gate) * up, both contiguous of one shape with a multiple of 8 elements. Under
// autograd only with allow_grad set, as a node whose backward is silu_mul_bwd.
int dflash_silu_mul(void* gate_, void* up_, int allow_grad, void** out) {
  KERNEL_TRY({
    const at::Tensor& g = *static_cast<at::Tensor*>(gate_);
    const at::Tensor& u = *static_cast<at::Tensor*>(up_);
    if (!serves({&g, &u})) return 1;
    if (g.sizes() != u.sizes() || !g.is_contiguous() || !u.is_contiguous() || g.numel() % 8 != 0) return 1;
    if (needs_grad({&g, &u})) {
      if (!allow_grad) return 1;
      *out = new at::Tensor(SiluMulFn::apply(g, u));
      return 0;
    }
    at::Tensor y;
    int rc = silu_mul_run(g, u, &y);
    if (rc != 0) return rc;
    *out = new at::Tensor(std::move(y));
    return 0;
  })
}

// The loss's pass over `logits` [R, V] (bf16, contiguous, V a multiple of 8), in place:
// each row becomes softmax(row) in bf16 with its label entry set to -rest; writes
// p_label [R] (fp32), rest [R] (fp32, the sum of the other entries) and argmax [R]
// (int64). labels: R int64 values.
int dflash_softmax_xent(void* logits_, void* labels_, void** p_label_out, void** rest_out, void** argmax_out) {
  KERNEL_TRY({
    at::Tensor& z = *static_cast<at::Tensor*>(logits_);
    const at::Tensor& y = *static_cast<at::Tensor*>(labels_);
    if (!applies({&z})) return 1;
    if (z.dim() != 2 || !z.is_contiguous() || z.size(1) % 8 != 0 || z.size(1) == 0 || z.size(1) > 0x7fffffff)
      return 1;
    if (!y.is_cuda() || y.device() != z.device() || y.scalar_type() != at::kLong || !y.is_contiguous() ||
        y.numel() != z.size(0))
      return 1;
    if (at::GradMode::is_enabled() && (z.requires_grad() || y.requires_grad())) return 1;
    c10::cuda::CUDAGuard guard(z.device());
    const int64_t rows = z.size(0);
    auto f32 = z.options().dtype(at::kFloat);
    auto p_label = at::empty({rows}, f32);
    auto rest = at::empty({rows}, f32);
    auto argmax = at::empty({rows}, z.options().dtype(at::kLong));
    if (rows > 0) {
      void* zp = z.data_ptr();
      const void* yp = y.data_ptr();
      long long v = z.size(1);
      void* pp = p_label.data_ptr();
      void* rp = rest.data_ptr();
      void* ap = argmax.data_ptr();
      void* args[] = {&zp, &yp, &v, &pp, &rp, &ap};
      if (rows > 0x7fffffff) return 1;
      int rc = launch(z.get_device(), SOFTMAX_XENT, static_cast<unsigned>(rows), 1024, args);
      if (rc != 0) return rc;
    }
    *p_label_out = new at::Tensor(std::move(p_label));
    *rest_out = new at::Tensor(std::move(rest));
    *argmax_out = new at::Tensor(std::move(argmax));
    return 0;
  })
}

}  // extern "C"
