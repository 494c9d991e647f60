// Thin C ABI over the parts of c10::cuda that tch does not expose: per-thread current
// streams, CUDA events for GPU timing, cross-stream hand-off of tensors. Every function
// returns 0 on success and a negative code (or writes nothing) on failure; none throws.
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <ATen/ATen.h>
#include <torch/types.h>
#include <cuda_runtime_api.h>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace {
thread_local char last_error[512] = {0};

void set_error(const char* msg) {
  std::strncpy(last_error, msg, sizeof(last_error) - 1);
  last_error[sizeof(last_error) - 1] = 0;
}

int cuda_check(cudaError_t err) {
  if (err == cudaSuccess) return 0;
  set_error(cudaGetErrorString(err));
  return -static_cast<int>(err);
}
}  // namespace

#define SHIM_TRY(body)                       \
  try {                                      \
    body                                     \
  } catch (const std::exception& e) {        \
    set_error(e.what());                     \
    return -1;                               \
  } catch (...) {                            \
    set_error("unknown C++ exception");      \
    return -1;                               \
  }

extern "C" {

const char* dflash_cuda_last_error() { return last_error; }

int dflash_cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

// A new stream from c10's pool, made current for the calling thread on `device`.
// Writes the stream's packed id (c10 StreamId) and raw handle.
int dflash_cuda_use_new_stream(int device, int64_t* stream_id, void** raw) {
  SHIM_TRY({
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    auto s = c10::cuda::getStreamFromPool(false, static_cast<c10::DeviceIndex>(device));
    c10::cuda::setCurrentCUDAStream(s);
    *stream_id = s.id();
    *raw = static_cast<void*>(s.stream());
    return 0;
  })
}

// A stream from c10's pool that is NOT made current: for work that must not disturb the
// calling thread's stream (the trace recorder's calibration events).
int dflash_cuda_new_stream(int device, int64_t* stream_id, void** raw) {
  SHIM_TRY({
    auto s = c10::cuda::getStreamFromPool(false, static_cast<c10::DeviceIndex>(device));
    *stream_id = s.id();
    *raw = static_cast<void*>(s.stream());
    return 0;
  })
}

// Name (NUL-terminated, cut to `name_len`) and total memory of `device`.
int dflash_cuda_device_properties(int device, char* name, size_t name_len, size_t* total_mem) {
  cudaDeviceProp prop;
  int rc = cuda_check(cudaGetDeviceProperties(&prop, device));
  if (rc != 0) return rc;
  if (name_len > 0) {
    std::strncpy(name, prop.name, name_len - 1);
    name[name_len - 1] = 0;
  }
  *total_mem = prop.totalGlobalMem;
  return 0;
}

// The calling thread's current stream on `device`.
int dflash_cuda_current_stream(int device, int64_t* stream_id, void** raw) {
  SHIM_TRY({
    auto s = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
    *stream_id = s.id();
    *raw = static_cast<void*>(s.stream());
    return 0;
  })
}

int dflash_cuda_set_device(int device) {
  SHIM_TRY({
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
    return 0;
  })
}

int dflash_cuda_stream_synchronize(void* stream) {
  return cuda_check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

int dflash_cuda_event_create(int device, void** event) {
  SHIM_TRY({
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    cudaEvent_t ev;
    int rc = cuda_check(cudaEventCreateWithFlags(&ev, cudaEventDefault));
    if (rc == 0) *event = static_cast<void*>(ev);
    return rc;
  })
}

int dflash_cuda_event_destroy(void* event) {
  return cuda_check(cudaEventDestroy(static_cast<cudaEvent_t>(event)));
}

int dflash_cuda_event_record(void* event, void* stream) {
  return cuda_check(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
}

}  // extern "C"

namespace {
// The driver's cuEventRecord, called directly on the recorder's hot path: the runtime's
// cudaEventRecord adds its own per-call work (lazy init, context checks) on top of it.
// Runtime and driver handles are interchangeable. Null when the driver entry point
// cannot be had, or when DFLASH_CUDA_EVENTS=runtime asks for the runtime call.
using event_record_fn = int (*)(void*, void*);
event_record_fn driver_event_record = nullptr;
std::once_flag driver_once;

void load_driver_record() {
  const char* want = std::getenv("DFLASH_CUDA_EVENTS");
  if (want != nullptr && std::strcmp(want, "runtime") == 0) return;
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status;
  if (cudaGetDriverEntryPointByVersion("cuEventRecord", &fn, 12000, cudaEnableDefault, &status) == cudaSuccess &&
      status == cudaDriverEntryPointSuccess) {
    driver_event_record = reinterpret_cast<event_record_fn>(fn);
  } else {
    cudaGetLastError();
  }
}
}  // namespace

extern "C" {

// 1 when events are recorded through the driver entry point, 0 through the runtime.
int dflash_cuda_events_use_driver() {
  std::call_once(driver_once, load_driver_record);
  return driver_event_record != nullptr ? 1 : 0;
}

// Records `event` on the calling thread's current stream on `device` (one call for the
// recorder's hot path) and writes that stream's packed id.
int dflash_cuda_event_record_current(int device, void* event, int64_t* stream_id) {
  SHIM_TRY({
    std::call_once(driver_once, load_driver_record);
    auto s = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
    *stream_id = s.id();
    if (driver_event_record != nullptr) {
      int rc = driver_event_record(event, static_cast<void*>(s.stream()));
      if (rc == 0) return 0;
      set_error("cuEventRecord failed");
      return -rc;
    }
    return cuda_check(cudaEventRecord(static_cast<cudaEvent_t>(event), s.stream()));
  })
}

// 1 when the event has completed, 0 when it has not, negative on error. Never blocks.
int dflash_cuda_event_query(void* event) {
  cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (err == cudaSuccess) return 1;
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return 0;
  }
  return cuda_check(err);
}

int dflash_cuda_event_synchronize(void* event) {
  return cuda_check(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
}

int dflash_cuda_event_elapsed_ms(void* start, void* end, float* ms) {
  return cuda_check(cudaEventElapsedTime(ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
}

int dflash_cuda_stream_wait_event(void* stream, void* event) {
  return cuda_check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0));
}

// Tell the caching allocator that `tensor`'s memory is in use on `stream` too, so it is
// not handed out again before the work queued there has finished.
int dflash_cuda_record_stream(void* tensor, int device, int64_t stream_id) {
  SHIM_TRY({
    auto* t = static_cast<torch::Tensor*>(tensor);
    if (!t->defined() || !t->is_cuda()) return 0;
    auto s = c10::cuda::CUDAStream::unpack3(stream_id, static_cast<c10::DeviceIndex>(device), c10::DeviceType::CUDA);
    c10::cuda::CUDACachingAllocator::recordStream(t->storage().data_ptr(), s);
    return 0;
  })
}

// One fused AdamW update (ATen's multi-tensor kernel, a single pass) of the fp32 tensors
// `param` from `grad`, with moments `exp_avg`/`exp_avg_sq` and the step count `step` (a
// one-element fp32 tensor on the same device, already incremented for this update).
// `grad_divisor`, when not null, is a one-element fp32 tensor the kernel divides the
// gradient by first (and writes the divided gradient back), the unscaling AMP uses.
int dflash_fused_adamw(void* param, void* grad, void* exp_avg, void* exp_avg_sq, void* step,
                       void* grad_divisor, double lr, double beta1, double beta2,
                       double weight_decay, double eps) {
  SHIM_TRY({
    auto& p = *static_cast<torch::Tensor*>(param);
    auto& g = *static_cast<torch::Tensor*>(grad);
    auto& m = *static_cast<torch::Tensor*>(exp_avg);
    auto& v = *static_cast<torch::Tensor*>(exp_avg_sq);
    auto& t = *static_cast<torch::Tensor*>(step);
    std::optional<at::Tensor> divisor;
    if (grad_divisor != nullptr) divisor = *static_cast<torch::Tensor*>(grad_divisor);
    at::NoGradGuard no_grad;
    at::_fused_adamw_({p}, {g}, {m}, {v}, {}, {t}, lr, beta1, beta2, weight_decay, eps,
                      /*amsgrad=*/false, /*maximize=*/false, divisor);
    return 0;
  })
}

// Drops the gradients of `n` tensors (PyTorch's `p.grad = None`), so the next backward pass
// hands each parameter its new gradient as it is instead of adding it to a zeroed buffer:
// tch's `zero_grad` keeps the buffer, and the backward then costs one fill and one add
// kernel per parameter.
int dflash_clear_grads(void** tensors, int64_t n) {
  SHIM_TRY({
    for (int64_t i = 0; i < n; ++i) static_cast<torch::Tensor*>(tensors[i])->mutable_grad().reset();
    return 0;
  })
}

}  // extern "C"
