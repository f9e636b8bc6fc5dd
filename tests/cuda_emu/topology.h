/* The emulated machine's topology (RINGTRAIN_EMU_TOPOLOGY, topology.cpp): which pairs of
 * emulated GPUs have a link (NVLink, PCIe peer-to-peer, or a path across sockets without
 * peer access), each link's bandwidth and latency, the host links, and the modelled time
 * of a copy. runtime.cpp answers cudaDeviceCanAccessPeer / cudaDeviceGetP2PAttribute from
 * it and, while it is set, advances an emulated clock by each copy's modelled time, so
 * that events time the model exactly (docs/cuda-emulation.md, "Topology").
 *
 * Devices here are physical indices (before CUDA_VISIBLE_DEVICES). Internal to the
 * emulated runtime. */
#ifndef RT_EMU_TOPOLOGY_H
#define RT_EMU_TOPOLOGY_H

#include <stddef.h>
#include <stdint.h>

enum rt_emu_link_kind { RT_EMU_LINK_NONE, RT_EMU_LINK_NVLINK, RT_EMU_LINK_PCIE, RT_EMU_LINK_SYS };

/* what a copy's ends are: a device (>= 0) or host memory */
enum { RT_EMU_HOST_PINNED = -1, RT_EMU_HOST_PAGEABLE = -2 };

/* Reads RINGTRAIN_EMU_TOPOLOGY once for `physical` devices (a malformed value stops the
 * program naming the entry and what was expected). Returns whether it is set. */
bool rt_emu_topo_init(int physical);
bool rt_emu_topo_active(void);
/* the link between physical devices a and b (either order); NONE when not listed */
rt_emu_link_kind rt_emu_topo_link(int a, int b);
/* cudaDevP2PAttr* of the pair a -> b (a != b): access supported, performance rank,
 * native atomics. Without a topology every pair is NVLink-like (peer access, rank 0). */
int rt_emu_topo_access(int a, int b);
int rt_emu_topo_rank(int a, int b);
int rt_emu_topo_atomics(int a, int b);
/* the modelled nanoseconds of a copy of n bytes from src to dst (devices, or the
 * RT_EMU_HOST_* values); `peer`: peer access is enabled between the two devices */
uint64_t rt_emu_topo_copy_ns(int src, int dst, size_t n, bool peer);

#endif
