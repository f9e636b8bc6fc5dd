/* The emulated machine's topology (topology.h): RINGTRAIN_EMU_TOPOLOGY, entries separated
 * by ';', each
 *
 *   A-B=KIND,GBPS,US    a link between physical devices A and B (both directions): KIND
 *                       nvlink (peer access, native atomics, performance rank 0), pcie
 *                       (peer access, rank 1, no atomics) or sys (no peer access: the
 *                       path between two sockets; copies take GBPS and US whatever is
 *                       enabled); GBPS its bandwidth in GB/s (1e9 bytes/s), US its latency
 *   A>B=KIND,GBPS,US    the direction A -> B only (over A-B's numbers for it): an asymmetric
 *                       link, so that a test tells a matrix from its transpose
 *   host=GBPS,US        each device's link to pinned host memory (default 25,5)
 *   pageable=GBPS,US    copies to and from pageable host memory (default 10,10)
 *   local=GBPS,US       a copy within one device (default 1000,1)
 *
 * A copy between devices takes its link's time when peer access is enabled between them
 * (nvlink, pcie) or the link is sys; otherwise (peer access off, or no link listed) the
 * driver stages it through host memory: two host-link copies. The modelled time of n
 * bytes is US * 1000 + n / GBPS nanoseconds. E.g. the puzzle of docs/bench.md:
 *   0-1=nvlink,62.4,2;0-4=pcie,31.6,5;0-2=sys,5.04,10
 */
#include "topology.h"

#include "emu_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <map>
#include <string>
#include <utility>

namespace {

struct link {
    rt_emu_link_kind kind;
    double gbps, us;
};

struct topology {
    bool active = false;
    int physical = 0;
    std::map<std::pair<int, int>, link> links;    /* (min, max) */
    std::map<std::pair<int, int>, link> directed; /* (from, to): A>B */
    link host{RT_EMU_LINK_NONE, 25.0, 5.0}, pageable{RT_EMU_LINK_NONE, 10.0, 10.0},
        local{RT_EMU_LINK_NONE, 1000.0, 1.0};
};

topology T;

const char *const k_env = "RINGTRAIN_EMU_TOPOLOGY";

[[noreturn]] void bad(const std::string &entry, const char *why) {
    rt_emu_fatal("%s: entry '%s': %s (expected A-B=nvlink|pcie|sys,GBPS,US or host=|pageable=|local=GBPS,US, "
                 "separated by ';'; docs/cuda-emulation.md)",
                 k_env, entry.c_str(), why);
}

/* "GBPS,US" into l (GBPS > 0, US >= 0, both finite) */
void parse_numbers(const std::string &entry, const char *s, link *l) {
    char *end;
    l->gbps = strtod(s, &end);
    if (end == s || *end != ',' || !(l->gbps > 0) || !isfinite(l->gbps))
        bad(entry, "the bandwidth must be GB/s above 0");
    const char *u = end + 1;
    l->us = strtod(u, &end);
    if (end == u || *end || !(l->us >= 0) || !isfinite(l->us))
        bad(entry, "the latency must be microseconds, 0 or more");
}

void parse_link(const std::string &entry, const std::string &key, const std::string &value) {
    char *end;
    long a = strtol(key.c_str(), &end, 10);
    if (end == key.c_str() || (*end != '-' && *end != '>')) bad(entry, "a link is named A-B or A>B");
    bool one_way = *end == '>';
    const char *bs = end + 1;
    long b = strtol(bs, &end, 10);
    if (end == bs || *end) bad(entry, "a link is named A-B or A>B");
    if (a < 0 || b < 0 || a >= T.physical || b >= T.physical)
        rt_emu_fatal("%s: entry '%s': device %ld does not exist (RINGTRAIN_EMU_GPUS=%d: devices 0..%d)", k_env,
                     entry.c_str(), a < 0 || a >= T.physical ? a : b, T.physical, T.physical - 1);
    if (a == b) bad(entry, "a link joins two different devices");
    size_t comma = value.find(',');
    std::string kind = value.substr(0, comma);
    link l{};
    if (kind == "nvlink")
        l.kind = RT_EMU_LINK_NVLINK;
    else if (kind == "pcie")
        l.kind = RT_EMU_LINK_PCIE;
    else if (kind == "sys")
        l.kind = RT_EMU_LINK_SYS;
    else
        bad(entry, "the kind must be nvlink, pcie or sys");
    if (comma == std::string::npos) bad(entry, "the kind is followed by ,GBPS,US");
    parse_numbers(entry, value.c_str() + comma + 1, &l);
    auto &table = one_way ? T.directed : T.links;
    auto key2 = one_way ? std::make_pair((int)a, (int)b) : std::make_pair((int)(a < b ? a : b), (int)(a < b ? b : a));
    if (!table.emplace(key2, l).second) bad(entry, "this pair is listed twice");
}

void parse_entry(const std::string &entry) {
    size_t eq = entry.find('=');
    if (eq == std::string::npos) bad(entry, "no '='");
    std::string key = entry.substr(0, eq), value = entry.substr(eq + 1);
    if (key == "host")
        parse_numbers(entry, value.c_str(), &T.host);
    else if (key == "pageable")
        parse_numbers(entry, value.c_str(), &T.pageable);
    else if (key == "local")
        parse_numbers(entry, value.c_str(), &T.local);
    else
        parse_link(entry, key, value);
}

uint64_t over(const link &l, size_t n) { return (uint64_t)llround(l.us * 1000.0 + (double)n / l.gbps); }

/* the link a -> b: its own direction's entry, else the pair's */
const link *find(int a, int b) {
    auto d = T.directed.find(std::make_pair(a, b));
    if (d != T.directed.end()) return &d->second;
    auto it = T.links.find(std::make_pair(a < b ? a : b, a < b ? b : a));
    return it == T.links.end() ? nullptr : &it->second;
}

} // namespace

bool rt_emu_topo_init(int physical) {
    const char *v = getenv(k_env);
    if (!v || !*v) return false;
    T.physical = physical;
    std::string all(v);
    for (size_t at = 0; at <= all.size();) {
        size_t semi = all.find(';', at);
        if (semi == std::string::npos) semi = all.size();
        std::string entry = all.substr(at, semi - at);
        entry.erase(0, entry.find_first_not_of(' '));
        entry.erase(entry.find_last_not_of(' ') + 1);
        if (!entry.empty()) parse_entry(entry);
        at = semi + 1;
    }
    T.active = true;
    return true;
}

bool rt_emu_topo_active(void) { return T.active; }

rt_emu_link_kind rt_emu_topo_link(int a, int b) {
    const link *l = find(a, b);
    return l ? l->kind : RT_EMU_LINK_NONE;
}

int rt_emu_topo_access(int a, int b) {
    if (!T.active) return 1;
    rt_emu_link_kind k = rt_emu_topo_link(a, b);
    return k == RT_EMU_LINK_NVLINK || k == RT_EMU_LINK_PCIE;
}

int rt_emu_topo_rank(int a, int b) { return T.active && rt_emu_topo_link(a, b) == RT_EMU_LINK_PCIE ? 1 : 0; }

int rt_emu_topo_atomics(int a, int b) { return !T.active || rt_emu_topo_link(a, b) == RT_EMU_LINK_NVLINK; }

uint64_t rt_emu_topo_copy_ns(int src, int dst, size_t n, bool peer) {
    if (src < 0 && dst < 0) return over(T.pageable, n); /* host to host: as pageable */
    if (src == RT_EMU_HOST_PAGEABLE || dst == RT_EMU_HOST_PAGEABLE) return over(T.pageable, n);
    if (src < 0 || dst < 0) return over(T.host, n);
    if (src == dst) return over(T.local, n);
    const link *l = find(src, dst);
    if (l && (l->kind == RT_EMU_LINK_SYS || (peer && l->kind != RT_EMU_LINK_NONE))) return over(*l, n);
    return 2 * over(T.host, n); /* staged through host memory */
}
