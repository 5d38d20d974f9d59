// A collective-permute between the devices of one process, moved by the copy engines.
//
// Why: XLA's collective-permute is an NCCL kernel that needs SMs of its own, so beside xgemm's
// persistent GEMM (every SM busy) each transfer of the K-sharded ring waited for the GEMM to end.
// A peer cuMemcpyAsync on a side stream uses the copy engines instead and runs under the GEMM.
//
// Contract (the Python side is xgemm/jax_ffi.py, exchange_attributes):
//   Every device of a group calls the same op (same `channel`) in the same program; each call
//   receives into its `recv` buffer the `send` buffer of rank sources[my rank] (same byte size).
//   devices   the local device ordinals of every group, group after group, in rank order
//   sources   per rank, the rank it receives from (itself: a local copy)
//   The caller may place recv inside a larger buffer (rows of a result, chosen by rank: see
//   xgemm_ffi.cc's "exchange" attribute) and ask for a local copy of its own send beside it.
//   The calls of a group meet twice on the host (a barrier, bounded by a timeout): once to publish
//   buffers and "ready" events, once after every copy is enqueued, so each device's stream then
//   waits for its own copy and for the copies that read its send buffer (XLA may reuse that
//   memory as soon as this op ends on the stream). The work between the two meetings (xgemm's
//   GEMM) runs on the caller's stream while the copy runs on a side stream.
//   Only devices of one process (one address space, unified addressing); not CUDA-graph safe.
// Host variant (tests on XLA:CPU with fake devices): the same meetings, the copy a memcpy.
#ifndef XGEMM_FFI_PEER_EXCHANGE_H_
#define XGEMM_FFI_PEER_EXCHANGE_H_
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cuda_min.h"
#include "foreign_abi.h"

namespace xgemm_exchange {

// The caller's loaded driver; the exchange needs its exchange_ok() entry points.
using Driver = xgemm_foreign::CudaDriver;

struct Route {
  int64_t channel = 0;
  int64_t group_size = 0;
  const int64_t* devices = nullptr;
  int64_t n_devices = 0;
  const int64_t* sources = nullptr;
  int64_t n_sources = 0;
};

struct Slot {                  // one rank's part of the current exchange
  int64_t run = 0;             // XLA's run id: every rank of one meeting must be in the same run
  const void* send = nullptr;
  void* recv = nullptr;
  size_t bytes = 0;
  CUcontext ctx = nullptr;
  // Per (op, group, rank), created at its first call and never released: a process that compiles
  // many distinct sharded programs holds 2 streams + 3 events per device for each exchange op.
  // (Sharing one pair of side streams per device would bound that; not done: untested on a GPU.)
  CUstream side = nullptr;
  CUstream side_local = nullptr;   // the local copy's stream (runs beside the peer copy)
  CUevent ready = nullptr;     // recorded on the caller's stream when the call starts
  CUevent done = nullptr;      // recorded on the side stream after the copy into recv
  CUevent done_local = nullptr;
};

class Group {
 public:
  explicit Group(int64_t n) : slots(static_cast<size_t>(n)) {}
  // Reusable barrier; false on timeout (the group is then unusable: a peer never arrived).
  bool Meet(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (broken_) return false;
    const uint64_t gen = generation_;
    if (++arrived_ == static_cast<int64_t>(slots.size())) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return true;
    }
    if (cv_.wait_for(lock, timeout, [&] { return generation_ != gen; })) return true;
    broken_ = true;
    cv_.notify_all();
    return false;
  }
  std::vector<Slot> slots;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t arrived_ = 0;
  uint64_t generation_ = 0;
  bool broken_ = false;
};

inline std::mutex& GroupsMutex() { static std::mutex mu; return mu; }
inline std::map<std::pair<int64_t, int64_t>, Group*>& Groups() {
  static auto* groups = new std::map<std::pair<int64_t, int64_t>, Group*>();   // lives for the process
  return *groups;
}

inline std::chrono::milliseconds Timeout() {
  const char* env = std::getenv("XGEMM_EXCHANGE_TIMEOUT_S");
  const long s = env ? std::atol(env) : 0;
  return std::chrono::milliseconds(1000 * (s > 0 ? s : 120));
}

// The group and rank of `ordinal` in the route; an error message when it is not there.
inline std::string Locate(const Route& r, int64_t ordinal, Group** group, int64_t* rank) {
  if (r.group_size <= 0 || r.n_devices % r.group_size != 0 || r.n_sources != r.group_size)
    return "bad route (devices / sources / group size disagree)";
  for (int64_t i = 0; i < r.n_devices; ++i) {
    if (r.devices[i] != ordinal) continue;
    const int64_t g = i / r.group_size;
    *rank = i % r.group_size;
    for (int64_t q = 0; q < r.group_size; ++q)
      if (r.sources[q] < 0 || r.sources[q] >= r.group_size) return "bad route (a source rank is out of range)";
    std::lock_guard<std::mutex> lock(GroupsMutex());
    Group*& slot = Groups()[{r.channel, g}];
    if (slot == nullptr) slot = new Group(r.group_size);
    *group = slot;
    return "";
  }
  return "device ordinal " + std::to_string(ordinal) + " is not in this exchange's route";
}

// After the first meeting: the ranks that met are all in this run. Two executions of one program
// reaching an exchange in a different order on different devices would otherwise pair buffers of
// different runs; now every rank reports the error instead (NCCL would deadlock there).
inline std::string SameRun(const Group& g, int64_t run) {
  for (const Slot& s : g.slots)
    if (s.run != run) return "the devices reached this exchange in different runs (executions of one program "
                             "interleaved differently across devices)";
  return "";
}

inline std::string CuFail(const char* what, CUresult rc) {
  return std::string(what) + " failed (CUresult " + std::to_string(rc) + ")";
}

// Enables this context's access to the peer's memory once (the copy then goes NVLink / PCIe
// peer-to-peer; the driver stages it through the host otherwise). Already enabled is fine.
inline void EnablePeer(const Driver& drv, CUcontext mine, CUcontext peer) {
  if (mine == peer) return;
  static std::mutex mu;
  static std::set<std::pair<CUcontext, CUcontext>> done;
  std::lock_guard<std::mutex> lock(mu);
  if (!done.insert({mine, peer}).second) return;
  drv.ctx_enable_peer_access(peer, 0);
}

// One rank's exchange on CUDA. Begin enqueues the copy on the side stream; the caller then
// enqueues its own work on `stream`; End makes `stream` wait for the copies that concern it.
class CudaExchange {
 public:
  CudaExchange(const Driver& drv, CUstream stream, Group* g, int64_t rank, const int64_t* sources, int64_t run)
      : drv_(drv), stream_(stream), g_(g), rank_(rank), sources_(sources), run_(run) {}

  // local: where to copy this rank's own send (or null).
  std::string Begin(const void* send, void* recv, size_t bytes, void* local) {
    CUcontext ctx = nullptr;
    if (CUresult rc = drv_.stream_get_ctx(stream_, &ctx); rc != CUDA_SUCCESS_) return CuFail("cuStreamGetCtx", rc);
    if (CUresult rc = drv_.ctx_push(ctx); rc != CUDA_SUCCESS_) return CuFail("cuCtxPushCurrent", rc);
    pushed_ = true;
    Slot& me = g_->slots[static_cast<size_t>(rank_)];
    if (me.side == nullptr) {
      CUresult rc = drv_.stream_create(&me.side, CU_STREAM_NON_BLOCKING_);
      if (rc == CUDA_SUCCESS_) rc = drv_.stream_create(&me.side_local, CU_STREAM_NON_BLOCKING_);
      if (rc == CUDA_SUCCESS_) rc = drv_.event_create(&me.ready, CU_EVENT_DISABLE_TIMING_);
      if (rc == CUDA_SUCCESS_) rc = drv_.event_create(&me.done, CU_EVENT_DISABLE_TIMING_);
      if (rc == CUDA_SUCCESS_) rc = drv_.event_create(&me.done_local, CU_EVENT_DISABLE_TIMING_);
      if (rc != CUDA_SUCCESS_) return CuFail("creating the exchange's stream and events", rc);
    }
    me.run = run_;
    me.send = send;
    me.recv = recv;
    me.bytes = bytes;
    me.ctx = ctx;
    if (CUresult rc = drv_.event_record(me.ready, stream_); rc != CUDA_SUCCESS_) return CuFail("cuEventRecord", rc);
    local_ = local != nullptr;
    if (local_ && bytes) {         // needs only this stream's data: start it before meeting
      CUresult rc = drv_.stream_wait_event(me.side_local, me.ready, 0);
      if (rc == CUDA_SUCCESS_)
        rc = drv_.memcpy_async(reinterpret_cast<CUdeviceptr>(local), reinterpret_cast<CUdeviceptr>(send), bytes,
                               me.side_local);
      if (rc == CUDA_SUCCESS_) rc = drv_.event_record(me.done_local, me.side_local);
      if (rc != CUDA_SUCCESS_) return CuFail("enqueueing the local copy", rc);
    }
    if (!g_->Meet(Timeout())) return "a peer device never reached this exchange (timeout)";
    met_ = 1;
    if (std::string why = SameRun(*g_, run_); !why.empty()) return why;
    const Slot& src = g_->slots[static_cast<size_t>(sources_[rank_])];
    if (src.bytes != bytes) return "send and receive buffers differ in size across devices";
    EnablePeer(drv_, ctx, src.ctx);
    // The side stream waits for this stream (recv's memory is free) and the source's (send written).
    CUresult rc = drv_.stream_wait_event(me.side, me.ready, 0);
    if (rc == CUDA_SUCCESS_) rc = drv_.stream_wait_event(me.side, src.ready, 0);
    if (rc == CUDA_SUCCESS_ && bytes)
      rc = drv_.memcpy_async(reinterpret_cast<CUdeviceptr>(recv), reinterpret_cast<CUdeviceptr>(src.send), bytes,
                             me.side);
    if (rc == CUDA_SUCCESS_) rc = drv_.event_record(me.done, me.side);
    if (rc != CUDA_SUCCESS_) return CuFail("enqueueing the peer copy", rc);
    return "";
  }

  // Always call (also after a failed Begin or a failed launch between): peers wait for us.
  std::string End() {
    std::string error;
    if (met_ == 1) {
      if (!g_->Meet(Timeout())) {
        error = "a peer device never finished this exchange (timeout)";
      } else {
        const int64_t n = static_cast<int64_t>(g_->slots.size());
        if (local_) {
          if (CUresult rc = drv_.stream_wait_event(stream_, g_->slots[static_cast<size_t>(rank_)].done_local, 0);
              rc != CUDA_SUCCESS_)
            error = CuFail("cuStreamWaitEvent", rc);
        }
        for (int64_t q = 0; q < n && error.empty(); ++q) {      // my copy, and those reading my send
          if (q != rank_ && sources_[q] != rank_) continue;
          if (CUresult rc = drv_.stream_wait_event(stream_, g_->slots[static_cast<size_t>(q)].done, 0);
              rc != CUDA_SUCCESS_)
            error = CuFail("cuStreamWaitEvent", rc);
        }
      }
    }
    if (pushed_) {
      CUcontext popped = nullptr;
      drv_.ctx_pop(&popped);
    }
    return error;
  }

 private:
  const Driver& drv_;
  CUstream stream_;
  Group* g_;
  int64_t rank_;
  const int64_t* sources_;
  int64_t run_;
  bool pushed_ = false;
  bool local_ = false;
  int met_ = 0;
};

// Host variant: the same two meetings; the copy is a memcpy between them.
inline std::string HostExchange(Group* g, int64_t rank, const int64_t* sources, int64_t run, const void* send,
                                void* recv, size_t bytes, void* local) {
  Slot& me = g->slots[static_cast<size_t>(rank)];
  me.run = run;
  me.send = send;
  me.recv = recv;
  me.bytes = bytes;
  if (!g->Meet(Timeout())) return "a peer device never reached this exchange (timeout)";
  const Slot& src = g->slots[static_cast<size_t>(sources[rank])];
  std::string error = SameRun(*g, run);
  if (error.empty() && src.bytes != bytes) error = "send and receive buffers differ in size across devices";
  if (error.empty() && bytes) std::memcpy(recv, src.send, bytes);
  if (error.empty() && bytes && local) std::memcpy(local, send, bytes);
  if (!g->Meet(Timeout())) return "a peer device never finished this exchange (timeout)";
  return error;
}

}  // namespace xgemm_exchange

#endif  // XGEMM_FFI_PEER_EXCHANGE_H_
