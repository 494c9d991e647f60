// CUDA activity capture (CUPTI's activity API) and the caching allocator's device
// statistics, behind a small C ABI for the trainer's kernel-level traces.
//
// CUPTI is loaded with dlopen when a capture starts, so the program runs (and builds)
// where it is absent; every entry point returns 0 on success and a negative code with a
// message (dflash_activity_last_error) otherwise, and none throws.
//
// Timestamps: CUPTI is given the trainer's own clock as its timestamp callback, so every
// record (API calls on the CPU, and kernels, copies and sets on the GPU, which CUPTI maps
// onto that clock) lands on the trace's clock without any conversion afterwards.
//
// Records are parsed when CUPTI hands back a full buffer (on its own thread, or at a
// flush) into compact fixed-size entries and names; the caller takes them after a flush.
//
// Locks: CUPTI calls the buffer callbacks while it holds locks of its own (a thread that
// launches a kernel and fills a buffer asks for the next one inside the launch), so no
// CUPTI function is ever called while `mu`, the lock the callbacks take, is held. Calling
// cuptiActivityDisable under it deadlocked at the end of a traced window while the target
// thread was still launching. Start and stop are ordered by `ctl`, which no callback takes.
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

extern "C" {
// One record, as the Rust side reads it (`src/cuda/activity.rs`, `RawActivity`).
struct DflashActivity {
  uint32_t kind;  // DFLASH_ACT_*
  uint32_t name;  // index into the name table
  uint64_t start;
  uint64_t end;
  uint32_t correlation;
  uint32_t device;
  uint32_t context;
  uint32_t stream;  // CUPTI's stream id (GPU records)
  uint32_t pid;     // API records: process and OS thread id
  uint32_t tid;
  int32_t grid[3];
  int32_t block[3];
  int32_t registers;
  int32_t shared_static;
  int32_t shared_dynamic;
  uint32_t detail;  // memcpy kind, overhead kind, synchronization type, API callback id
  uint64_t bytes;   // memcpy and memset size
};
}

namespace {
enum : uint32_t {
  ACT_KERNEL = 1,
  ACT_MEMCPY = 2,
  ACT_MEMSET = 3,
  ACT_RUNTIME = 4,
  ACT_DRIVER = 5,
  ACT_OVERHEAD = 6,
  ACT_SYNC = 7,
};

thread_local char last_error[512] = {0};
void set_error(const std::string& msg) {
  std::strncpy(last_error, msg.c_str(), sizeof(last_error) - 1);
  last_error[sizeof(last_error) - 1] = 0;
}

// The CUPTI entry points used, resolved from the shared library at the first start.
struct Cupti {
  void* lib = nullptr;
  CUptiResult (*activity_enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*activity_disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*register_timestamp)(CUpti_TimestampCallbackFunc) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
  CUptiResult (*next_record)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
  CUptiResult (*dropped)(CUcontext, uint32_t, size_t*) = nullptr;
  CUptiResult (*callback_name)(CUpti_CallbackDomain, uint32_t, const char**) = nullptr;
  CUptiResult (*result_string)(CUptiResult, const char**) = nullptr;
  CUptiResult (*stream_id)(CUcontext, CUstream, uint8_t, uint32_t*) = nullptr;
  CUptiResult (*get_version)(uint32_t*) = nullptr;
  CUptiResult (*enable_runtime_api)(CUpti_CallbackId, uint8_t) = nullptr;
  CUptiResult (*enable_driver_api)(CUpti_CallbackId, uint8_t) = nullptr;
  // optional: API records then name threads by gettid(), as the trace does
  CUptiResult (*set_thread_id_type)(CUpti_ActivityThreadIdType) = nullptr;
};

Cupti cupti;
std::mutex mu;  // guards the records, the name table and the dropped count; no CUPTI call under it
std::vector<DflashActivity> records;
std::deque<std::string> names;  // a deque: the c_str() handed out stays put as names are added
std::unordered_map<std::string, uint32_t> name_ids;
uint64_t records_dropped = 0;
std::atomic<size_t> buffer_bytes{8u << 20};
std::atomic<uint64_t> buffers_given{0};
std::atomic<uint64_t (*)()> clock_fn{nullptr};
std::mutex ctl;  // orders start and stop (and guards `capturing` and `all_apis`); no callback takes it
bool capturing = false;

// GPU work, the driver's own overhead and host synchronizations. Runtime and driver API
// calls are not enabled as whole kinds: libtorch calls cudaGetDevice and friends tens of
// thousands of times a step, and recording each would cost more than the work it
// explains. Only the calls that launch, copy, set, allocate, free, record events or wait
// are enabled, one callback id at a time (api_wanted).
const CUpti_ActivityKind kinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,          CUPTI_ACTIVITY_KIND_MEMSET,
    CUPTI_ACTIVITY_KIND_OVERHEAD,          CUPTI_ACTIVITY_KIND_SYNCHRONIZATION,
};
// Every runtime and driver function CUPTI names, and whether its records are kept.
struct ApiSwitch {
  CUpti_CallbackDomain domain;
  uint32_t cbid;
  bool wanted;
};
std::vector<ApiSwitch> all_apis;

std::string result_text(CUptiResult r) {
  const char* s = nullptr;
  if (cupti.result_string != nullptr && cupti.result_string(r, &s) == CUPTI_SUCCESS && s != nullptr) return s;
  return "CUPTI error " + std::to_string(static_cast<int>(r));
}

template <typename F>
bool resolve(F*& slot, const char* sym) {
  slot = reinterpret_cast<F*>(dlsym(cupti.lib, sym));
  if (slot == nullptr) set_error(std::string("CUPTI has no ") + sym);
  return slot != nullptr;
}

bool load_cupti() {
  if (cupti.lib != nullptr) return true;
  const char* candidates[] = {"libcupti.so.13", "libcupti.so"};
  for (const char* c : candidates) {
    cupti.lib = dlopen(c, RTLD_NOW | RTLD_GLOBAL);
    if (cupti.lib != nullptr) break;
  }
  if (cupti.lib == nullptr) {
    const char* e = dlerror();
    set_error(std::string("CUPTI (libcupti.so.13) could not be loaded: ") + (e ? e : "not found"));
    return false;
  }
  bool ok = resolve(cupti.activity_enable, "cuptiActivityEnable") &&
            resolve(cupti.activity_disable, "cuptiActivityDisable") &&
            resolve(cupti.register_callbacks, "cuptiActivityRegisterCallbacks") &&
            resolve(cupti.register_timestamp, "cuptiActivityRegisterTimestampCallback") &&
            resolve(cupti.flush_all, "cuptiActivityFlushAll") &&
            resolve(cupti.next_record, "cuptiActivityGetNextRecord") &&
            resolve(cupti.dropped, "cuptiActivityGetNumDroppedRecords") &&
            resolve(cupti.callback_name, "cuptiGetCallbackName") &&
            resolve(cupti.result_string, "cuptiGetResultString") &&
            resolve(cupti.stream_id, "cuptiGetStreamIdEx") && resolve(cupti.get_version, "cuptiGetVersion") &&
            resolve(cupti.enable_runtime_api, "cuptiActivityEnableRuntimeApi") &&
            resolve(cupti.enable_driver_api, "cuptiActivityEnableDriverApi");
  cupti.set_thread_id_type =
      reinterpret_cast<decltype(cupti.set_thread_id_type)>(dlsym(cupti.lib, "cuptiSetThreadIdType"));
  if (!ok) {
    dlclose(cupti.lib);
    cupti.lib = nullptr;
    return false;
  }
  uint32_t v = 0;
  if (cupti.get_version(&v) != CUPTI_SUCCESS || v < CUPTI_API_VERSION) {
    set_error("CUPTI API version " + std::to_string(v) + " is older than the " + std::to_string(CUPTI_API_VERSION) +
              " this program was built with");
    return false;
  }
  return true;
}

uint32_t intern(const std::string& s) {
  std::lock_guard<std::mutex> g(mu);
  auto it = name_ids.find(s);
  if (it != name_ids.end()) return it->second;
  uint32_t id = static_cast<uint32_t>(names.size());
  names.push_back(s);
  name_ids.emplace(s, id);
  return id;
}

std::string demangle(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status == 0 && d != nullptr) {
    std::string s(d);
    std::free(d);
    return s;
  }
  return name;
}

std::string api_name(CUpti_CallbackDomain domain, uint32_t cbid) {
  const char* n = nullptr;
  if (cupti.callback_name(domain, cbid, &n) == CUPTI_SUCCESS && n != nullptr) {
    std::string s(n);
    // CUPTI names versioned entry points ("cudaLaunchKernel_v7000"); Kineto drops the suffix.
    auto v = s.rfind("_v");
    if (v != std::string::npos && v + 2 < s.size() && s.find_first_not_of("0123456789", v + 2) == std::string::npos)
      s.resize(v);
    return s;
  }
  return (domain == CUPTI_CB_DOMAIN_RUNTIME_API ? "cuda runtime " : "cuda driver ") + std::to_string(cbid);
}

// Whether API records of the call named `name` (version suffix dropped) are kept.
bool api_wanted(const std::string& name, bool runtime) {
  static const char* runtime_prefixes[] = {
      "cudaLaunch",          "cudaGraphLaunch",        "cudaMemcpy",           "cudaMemset",
      "cudaMalloc",          "cudaFree",               "cudaHostAlloc",        "cudaDeviceSynchronize",
      "cudaStreamSynchronize", "cudaEventSynchronize", "cudaStreamWaitEvent", "cudaThreadSynchronize",
      "cudaEventRecord",
  };
  static const char* driver_prefixes[] = {
      "cuLaunch",          "cuGraphLaunch",       "cuMemcpy",         "cuMemset",          "cuMemAlloc",
      "cuMemFree",         "cuMemHostAlloc",      "cuMemCreate",      "cuMemRelease",      "cuMemMap",
      "cuMemUnmap",        "cuMemAddressReserve", "cuMemAddressFree", "cuMemSetAccess",    "cuCtxSynchronize",
      "cuStreamSynchronize", "cuEventSynchronize", "cuStreamWaitEvent", "cuEventRecord",
  };
  if (runtime) {
    for (const char* p : runtime_prefixes)
      if (name.rfind(p, 0) == 0) return true;
  } else {
    for (const char* p : driver_prefixes)
      if (name.rfind(p, 0) == 0) return true;
  }
  return false;
}

// Enables (or disables) the wanted runtime and driver API records, by callback id.
//
// A per-function switch turned on after the CUDA context exists records nothing while
// the kind of API records is off (CUPTI 13 on a card: the switches only filter the kind).
// So the two API kinds are switched on whole and every unwanted function is switched off
// after it; switching a kind on again forgets those choices, so this runs at each start.
bool set_apis(bool on) {
  if (on && all_apis.empty()) {
    for (int runtime = 0; runtime < 2; ++runtime) {
      auto domain = runtime ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API;
      uint32_t size = runtime ? static_cast<uint32_t>(CUPTI_RUNTIME_TRACE_CBID_SIZE)
                              : static_cast<uint32_t>(CUPTI_DRIVER_TRACE_CBID_SIZE);
      for (uint32_t cbid = 1; cbid < size; ++cbid) {
        const char* n = nullptr;
        if (cupti.callback_name(domain, cbid, &n) != CUPTI_SUCCESS || n == nullptr) continue;
        all_apis.push_back({domain, cbid, api_wanted(n, runtime != 0)});
      }
    }
  }
  if (!on) {
    cupti.activity_disable(CUPTI_ACTIVITY_KIND_RUNTIME);
    cupti.activity_disable(CUPTI_ACTIVITY_KIND_DRIVER);
    return true;
  }
  for (CUpti_ActivityKind k : {CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER}) {
    CUptiResult r = cupti.activity_enable(k);
    if (r != CUPTI_SUCCESS) {
      set_error("CUPTI could not enable API records: " + result_text(r));
      return false;
    }
  }
  for (const ApiSwitch& a : all_apis) {
    CUptiResult r = a.domain == CUPTI_CB_DOMAIN_RUNTIME_API ? cupti.enable_runtime_api(a.cbid, a.wanted ? 1 : 0)
                                                            : cupti.enable_driver_api(a.cbid, a.wanted ? 1 : 0);
    // a function this CUPTI does not trace cannot be switched: it records nothing anyway
    if (r != CUPTI_SUCCESS && r != CUPTI_ERROR_INVALID_PARAMETER && r != CUPTI_ERROR_NOT_SUPPORTED) {
      set_error("CUPTI could not filter API records: " + result_text(r));
      return false;
    }
  }
  return true;
}

const char* memcpy_name(uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "Memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "Memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "Memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "Memcpy HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "Memcpy PtoP";
    default: return "Memcpy";
  }
}

const char* overhead_name(CUpti_ActivityOverheadKind k) {
  switch (k) {
    case CUPTI_ACTIVITY_OVERHEAD_DRIVER_COMPILER: return "Driver Compiler";
    case CUPTI_ACTIVITY_OVERHEAD_CUPTI_BUFFER_FLUSH: return "CUPTI Buffer Flush";
    case CUPTI_ACTIVITY_OVERHEAD_CUPTI_INSTRUMENTATION: return "CUPTI Instrumentation";
    case CUPTI_ACTIVITY_OVERHEAD_CUPTI_RESOURCE: return "CUPTI Resource";
    case CUPTI_ACTIVITY_OVERHEAD_RUNTIME_TRIGGERED_MODULE_LOADING: return "Lazy Module Loading";
    case CUPTI_ACTIVITY_OVERHEAD_LAZY_FUNCTION_LOADING: return "Lazy Function Loading";
    case CUPTI_ACTIVITY_OVERHEAD_COMMAND_BUFFER_FULL: return "Command Buffer Full";
    case CUPTI_ACTIVITY_OVERHEAD_ACTIVITY_BUFFER_REQUEST: return "Activity Buffer Request";
    case CUPTI_ACTIVITY_OVERHEAD_UVM_ACTIVITY_INIT: return "UVM Activity Init";
    default: return "Overhead";
  }
}

const char* sync_name(CUpti_ActivitySynchronizationType t) {
  switch (t) {
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE: return "Event Sync";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT: return "Stream Wait Event";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE: return "Stream Sync";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE: return "Context Sync";
    default: return "Sync";
  }
}

// Parses one record into `out`; false for kinds not kept. Called with `mu` held.
bool parse(const CUpti_Activity* rec, DflashActivity& out) {
  std::memset(&out, 0, sizeof(out));
  switch (rec->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      out.kind = ACT_KERNEL;
      out.name = intern(demangle(k->name));
      out.start = k->start;
      out.end = k->end;
      out.correlation = k->correlationId;
      out.device = k->deviceId;
      out.context = k->contextId;
      out.stream = k->streamId;
      out.grid[0] = k->gridX, out.grid[1] = k->gridY, out.grid[2] = k->gridZ;
      out.block[0] = k->blockX, out.block[1] = k->blockY, out.block[2] = k->blockZ;
      out.registers = k->registersPerThread;
      out.shared_static = k->staticSharedMemory;
      out.shared_dynamic = k->dynamicSharedMemory;
      return true;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
      out.kind = ACT_MEMCPY;
      out.name = intern(memcpy_name(m->copyKind));
      out.start = m->start;
      out.end = m->end;
      out.correlation = m->correlationId;
      out.device = m->deviceId;
      out.context = m->contextId;
      out.stream = m->streamId;
      out.detail = m->copyKind;
      out.bytes = m->bytes;
      return true;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
      out.kind = ACT_MEMSET;
      out.name = intern("Memset");
      out.start = m->start;
      out.end = m->end;
      out.correlation = m->correlationId;
      out.device = m->deviceId;
      out.context = m->contextId;
      out.stream = m->streamId;
      out.bytes = m->bytes;
      return true;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: {
      auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
      bool runtime = rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME;
      out.kind = runtime ? ACT_RUNTIME : ACT_DRIVER;
      out.name = intern(api_name(runtime ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API, a->cbid));
      out.start = a->start;
      out.end = a->end;
      out.correlation = a->correlationId;
      out.pid = a->processId;
      out.tid = a->threadId;
      out.detail = a->cbid;
      return true;
    }
    case CUPTI_ACTIVITY_KIND_OVERHEAD: {
      auto* o = reinterpret_cast<const CUpti_ActivityOverhead3*>(rec);
      out.kind = ACT_OVERHEAD;
      out.name = intern(overhead_name(o->overheadKind));
      out.start = o->start;
      out.end = o->end;
      out.correlation = o->correlationId;
      out.detail = o->overheadKind;
      if (o->objectKind == CUPTI_ACTIVITY_OBJECT_THREAD || o->objectKind == CUPTI_ACTIVITY_OBJECT_PROCESS) {
        out.pid = o->objectId.pt.processId;
        out.tid = o->objectId.pt.threadId;
      } else if (o->objectKind == CUPTI_ACTIVITY_OBJECT_DEVICE || o->objectKind == CUPTI_ACTIVITY_OBJECT_CONTEXT ||
                 o->objectKind == CUPTI_ACTIVITY_OBJECT_STREAM) {
        out.device = o->objectId.dcs.deviceId;
        out.context = o->objectId.dcs.contextId;
        out.stream = o->objectId.dcs.streamId;
      }
      return true;
    }
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
      auto* s = reinterpret_cast<const CUpti_ActivitySynchronization2*>(rec);
      out.kind = ACT_SYNC;
      out.name = intern(sync_name(s->type));
      out.start = s->start;
      out.end = s->end;
      out.correlation = s->correlationId;
      out.context = s->contextId;
      out.stream = s->streamId;
      out.detail = s->type;
      return true;
    }
    default:
      return false;
  }
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  size_t bytes = buffer_bytes.load(std::memory_order_relaxed);
  buffers_given.fetch_add(1, std::memory_order_relaxed);
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, bytes));
  *size = *buffer != nullptr ? bytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
  // Parsed outside `mu` (names take it one at a time), appended under it.
  std::vector<DflashActivity> parsed;
  CUpti_Activity* rec = nullptr;
  DflashActivity out;
  while (cupti.next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (parse(rec, out)) parsed.push_back(out);
  }
  size_t dropped = 0;
  if (cupti.dropped(ctx, stream, &dropped) != CUPTI_SUCCESS) dropped = 0;
  std::free(buffer);
  std::lock_guard<std::mutex> g(mu);
  records.insert(records.end(), parsed.begin(), parsed.end());
  records_dropped += dropped;
}

uint64_t CUPTIAPI timestamp() { return clock_fn.load(std::memory_order_relaxed)(); }
}  // namespace

extern "C" {

const char* dflash_activity_last_error() { return last_error; }

// Starts capturing CUDA activity with `clock` as CUPTI's timestamp source and buffers of
// `buffer_size` bytes. Records collected before are kept until taken.
int dflash_activity_start(uint64_t (*clock)(), size_t buffer_size) {
  std::lock_guard<std::mutex> g(ctl);
  if (capturing) return 0;
  if (!load_cupti()) return -1;
  clock_fn.store(clock);
  if (buffer_size >= (64u << 10)) buffer_bytes.store(buffer_size);
  if (cupti.set_thread_id_type != nullptr) cupti.set_thread_id_type(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM);
  CUptiResult r = cupti.register_timestamp(timestamp);
  if (r == CUPTI_SUCCESS) r = cupti.register_callbacks(buffer_requested, buffer_completed);
  if (r != CUPTI_SUCCESS) {
    set_error("CUPTI set-up failed: " + result_text(r));
    return -2;
  }
  for (CUpti_ActivityKind k : kinds) {
    r = cupti.activity_enable(k);
    if (r != CUPTI_SUCCESS) {
      set_error("CUPTI could not enable activity kind " + std::to_string(static_cast<int>(k)) + ": " + result_text(r));
      for (CUpti_ActivityKind d : kinds) cupti.activity_disable(d);
      return -3;
    }
  }
  if (!set_apis(true)) {
    for (CUpti_ActivityKind d : kinds) cupti.activity_disable(d);
    set_apis(false);
    return -3;
  }
  capturing = true;
  return 0;
}

// Stops capturing and flushes every buffer, so that all records up to now can be taken.
int dflash_activity_stop() {
  std::lock_guard<std::mutex> g(ctl);
  if (!capturing) return 0;
  for (CUpti_ActivityKind k : kinds) cupti.activity_disable(k);
  set_apis(false);
  capturing = false;
  // The completion callback takes `mu` (not `ctl`), so flushing under `ctl` is safe.
  CUptiResult r = cupti.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  if (r != CUPTI_SUCCESS) {
    set_error("CUPTI flush failed: " + result_text(r));
    return -4;
  }
  return 0;
}

// Flushes completed buffers while capturing goes on (records of work still running stay).
int dflash_activity_flush() {
  if (cupti.flush_all == nullptr) return 0;
  CUptiResult r = cupti.flush_all(0);
  return r == CUPTI_SUCCESS ? 0 : -4;
}

// Moves up to `cap` records into `out` (oldest first) and returns how many were moved.
size_t dflash_activity_take(DflashActivity* out, size_t cap) {
  std::lock_guard<std::mutex> g(mu);
  size_t n = records.size() < cap ? records.size() : cap;
  std::memcpy(out, records.data(), n * sizeof(DflashActivity));
  records.erase(records.begin(), records.begin() + static_cast<std::ptrdiff_t>(n));
  return n;
}

size_t dflash_activity_pending() {
  std::lock_guard<std::mutex> g(mu);
  return records.size();
}

// Name `id` of the name table (valid until the next start), or null.
const char* dflash_activity_name(uint32_t id) {
  std::lock_guard<std::mutex> g(mu);
  return id < names.size() ? names[id].c_str() : nullptr;
}

// Records CUPTI reported dropped (buffers too small or full) and buffers handed out.
void dflash_activity_counts(uint64_t* dropped, uint64_t* buffers) {
  std::lock_guard<std::mutex> g(mu);
  *dropped = records_dropped;
  *buffers = buffers_given.load();
}

// CUPTI's id of a stream given by its raw handle, so that records can be matched to the
// trace's stream tracks; negative when it cannot be had.
int dflash_activity_stream_id(void* stream, uint32_t* id) {
  if (cupti.stream_id == nullptr) return -1;
  CUptiResult r = cupti.stream_id(nullptr, static_cast<CUstream>(stream), 0, id);
  if (r != CUPTI_SUCCESS) {
    set_error("CUPTI stream id: " + result_text(r));
    return -5;
  }
  return 0;
}

// The caching allocator's statistics for `device`: bytes allocated and reserved now,
// device allocations and frees, allocation retries and OOMs since the start.
int dflash_allocator_stats(int device, int64_t* out6) {
  try {
    auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
    const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    out6[0] = s.allocated_bytes[agg].current;
    out6[1] = s.reserved_bytes[agg].current;
    out6[2] = s.num_device_alloc;
    out6[3] = s.num_device_free;
    out6[4] = s.num_alloc_retries;
    out6[5] = s.num_ooms;
    return 0;
  } catch (const std::exception& e) {
    set_error(e.what());
    return -1;
  } catch (...) {
    set_error("unknown C++ exception");
    return -1;
  }
}

}  // extern "C"
