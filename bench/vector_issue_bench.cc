// Issue rate of the x86 vector instructions the decode readers are made of: the AVX2 ones (the
// float readers and src/run/attention_madd-inl.h) and, as BM_Issue512, the 512-bit ones of the
// AVX-512 readers (src/run/attention_vnni-inl.h, attention_bf16-inl.h) and their stores:
// instructions per second on one thread, each kind alone and in pairs of kinds. A loop turn holds
// 14 instructions on 14 registers, one each, so a turn's chains are one instruction long: latency
// bounds a turn at its kinds' longest (14 per 4 cycles for FMAs, 3.5 a cycle, above any pair's
// issue rate measured), and what is measured is how many can start per cycle and on which ports.
// (Until 2026-12-06 a turn held 16 on 14 registers: two registers took two instructions of one
// kind, so a pair with a 4-cycle kind could not exceed 16 per 8 cycles, nor one with a 3-cycle kind
// 16 per 6, whatever its ports: the fifteenth round's 2 and 2.67 a cycle for such pairs were those
// bounds.) With a kernel's instruction count per token this gives its arithmetic floor on the
// machine (docs/representation-speed.md, fifteenth round; AVX-512, thirtieth round). x86-64 CPUs
// with AVX2 and FMA only (BM_Issue512: AVX-512 with VNNI, VBMI and BF16); elsewhere each benchmark
// skips with a message.
//
//   build/release/vector_issue_bench
//
// Counter: `per_second`, instructions per second (alone: the kind's throughput; in a pair: both
// kinds together, so a pair at the single kinds' rate shares their ports, one at twice it does
// not).
#include <cstdint>

#include "benchmark/benchmark.h"

namespace kvstack {
namespace {

#if defined(__x86_64__)

constexpr int64_t kTurns = 1 << 20;
constexpr int kPerTurn = 14;

bool HasAvx2Fma() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

// One instruction of each kind on register r (ymm8 and ymm9 are read-only sources; %1 points
// at a dword).
#define KVS_FMA(r) "vfmadd231ps %%ymm8, %%ymm9, " r "\n"
#define KVS_MADDWD(r) "vpmaddwd %%ymm8, " r ", " r "\n"
#define KVS_MADDUBSW(r) "vpmaddubsw %%ymm8, " r ", " r "\n"
#define KVS_ADDW(r) "vpaddw %%ymm8, " r ", " r "\n"
#define KVS_SRLD(r) "vpsrld $4, " r ", " r "\n"
#define KVS_SHUFB(r) "vpshufb %%ymm8, " r ", " r "\n"
#define KVS_CVTPH(r) "vcvtph2ps %%xmm8, " r "\n"
#define KVS_BCASTD(r) "vpbroadcastd (%1), " r "\n"
#define KVS_AND(r) "vpand %%ymm8, " r ", " r "\n"
#define KVS_SLLW(r) "vpsllw $4, " r ", " r "\n"
#define KVS_UNPCKBW(r) "vpunpcklbw %%ymm8, " r ", " r "\n"
// 14 instructions, kinds A and B alternating, each on its own register.
// clang-format off
#define KVS_TURN(A, B)                                                              \
  A("%%ymm0") B("%%ymm1") A("%%ymm2") B("%%ymm3") A("%%ymm4") B("%%ymm5")           \
  A("%%ymm6") B("%%ymm7") A("%%ymm10") B("%%ymm11") A("%%ymm12") B("%%ymm13")       \
  A("%%ymm14") B("%%ymm15")
// clang-format on
// A loop of `turns` turns of TURN (KVS_TURN or KVS_TURN512), after SETUP, in a function with
// the attributes TARGET (empty, or a target that lets the clobbers beyond the vector registers,
// `...`, name mask registers). %1 points at a 64-byte line whose first dword is 1: what the
// broadcasts read and the stores write. The VEX zeroing of xmm8 and xmm9 clears their whole zmm
// registers.
#define KVS_LOOP_OF(TARGET, SETUP, TURN, ...)                                                      \
  [](int64_t turns) TARGET {                                                                       \
    alignas(64) int32_t line[16] = {1};                                                            \
    asm volatile(                                                                                  \
        "vpxor %%xmm8, %%xmm8, %%xmm8\n"                                                           \
        "vpxor %%xmm9, %%xmm9, %%xmm9\n" SETUP "1:\n" TURN                                         \
        "dec %0\n"                                                                                 \
        "jnz 1b\n"                                                                                 \
        "vzeroupper\n"                                                                             \
        : "+r"(turns)                                                                              \
        : "r"(line)                                                                                \
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", \
          "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "cc", "memory" __VA_OPT__(, ) __VA_ARGS__); \
  }
#define KVS_ISSUE_LOOP_OF(TURN) KVS_LOOP_OF(, "", TURN)
#define KVS_ISSUE_LOOP(A, B) KVS_ISSUE_LOOP_OF(KVS_TURN(A, B))

using IssueLoop = void (*)(int64_t);

// Runs `loop` where the CPU `supported` it, else skips saying what it `needs`.
void RunIssueLoop(benchmark::State& state, IssueLoop loop, bool supported, const char* needs) {
  if (!supported) {
    state.SkipWithError(needs);
    return;
  }
  for (auto _ : state) loop(kTurns);
  state.counters["per_second"] = benchmark::Counter(static_cast<double>(kTurns * kPerTurn),
                                                    benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Issue(benchmark::State& state, IssueLoop loop) {
  RunIssueLoop(state, loop, HasAvx2Fma(), "needs a CPU with AVX2 and FMA");
}

BENCHMARK_CAPTURE(BM_Issue, vfmadd231ps, KVS_ISSUE_LOOP(KVS_FMA, KVS_FMA));
BENCHMARK_CAPTURE(BM_Issue, vpmaddwd, KVS_ISSUE_LOOP(KVS_MADDWD, KVS_MADDWD));
BENCHMARK_CAPTURE(BM_Issue, vpmaddubsw, KVS_ISSUE_LOOP(KVS_MADDUBSW, KVS_MADDUBSW));
BENCHMARK_CAPTURE(BM_Issue, vpaddw, KVS_ISSUE_LOOP(KVS_ADDW, KVS_ADDW));
BENCHMARK_CAPTURE(BM_Issue, vpsrld, KVS_ISSUE_LOOP(KVS_SRLD, KVS_SRLD));
BENCHMARK_CAPTURE(BM_Issue, vpshufb, KVS_ISSUE_LOOP(KVS_SHUFB, KVS_SHUFB));
BENCHMARK_CAPTURE(BM_Issue, vcvtph2ps, KVS_ISSUE_LOOP(KVS_CVTPH, KVS_CVTPH));
BENCHMARK_CAPTURE(BM_Issue, vpbroadcastd_m32, KVS_ISSUE_LOOP(KVS_BCASTD, KVS_BCASTD));
// The pairs the readers' inner loops are made of.
BENCHMARK_CAPTURE(BM_Issue, vpmaddubsw_vpaddw, KVS_ISSUE_LOOP(KVS_MADDUBSW, KVS_ADDW));
BENCHMARK_CAPTURE(BM_Issue, vpmaddwd_vpaddw, KVS_ISSUE_LOOP(KVS_MADDWD, KVS_ADDW));
BENCHMARK_CAPTURE(BM_Issue, vpmaddwd_vpbroadcastd_m32, KVS_ISSUE_LOOP(KVS_MADDWD, KVS_BCASTD));
BENCHMARK_CAPTURE(BM_Issue, vpmaddubsw_vpsrld, KVS_ISSUE_LOOP(KVS_MADDUBSW, KVS_SRLD));
BENCHMARK_CAPTURE(BM_Issue, vpmaddubsw_vpmaddwd, KVS_ISSUE_LOOP(KVS_MADDUBSW, KVS_MADDWD));
BENCHMARK_CAPTURE(BM_Issue, vfmadd231ps_vpsrld, KVS_ISSUE_LOOP(KVS_FMA, KVS_SRLD));
BENCHMARK_CAPTURE(BM_Issue, vfmadd231ps_vcvtph2ps, KVS_ISSUE_LOOP(KVS_FMA, KVS_CVTPH));
BENCHMARK_CAPTURE(BM_Issue, vfmadd231ps_vpmaddwd, KVS_ISSUE_LOOP(KVS_FMA, KVS_MADDWD));
// What FP8 rows' conversions could be made of besides shifts (kFp8E4M3Pairs).
BENCHMARK_CAPTURE(BM_Issue, vfmadd231ps_vpand, KVS_ISSUE_LOOP(KVS_FMA, KVS_AND));
BENCHMARK_CAPTURE(BM_Issue, vfmadd231ps_vpsllw, KVS_ISSUE_LOOP(KVS_FMA, KVS_SLLW));
BENCHMARK_CAPTURE(BM_Issue, vfmadd231ps_vpshufb, KVS_ISSUE_LOOP(KVS_FMA, KVS_SHUFB));
BENCHMARK_CAPTURE(BM_Issue, vfmadd231ps_vpunpcklbw, KVS_ISSUE_LOOP(KVS_FMA, KVS_UNPCKBW));

bool HasAvx512Readers() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi") &&
         __builtin_cpu_supports("avx512bf16");
}

// The 512-bit kinds, the same way: zmm8 and zmm9 read-only sources, %1 a dword.
#define KVS_DPBUSD(r) "vpdpbusd %%zmm8, %%zmm9, " r "\n"
#define KVS_DPBUSD_BCST(r) "vpdpbusd (%1)%{1to16%}, %%zmm9, " r "\n"
#define KVS_DPWSSD(r) "vpdpwssd %%zmm8, %%zmm9, " r "\n"
#define KVS_DPBF16(r) "vdpbf16ps %%zmm8, %%zmm9, " r "\n"
#define KVS_FMA512(r) "vfmadd231ps %%zmm8, %%zmm9, " r "\n"
#define KVS_PERMT2D(r) "vpermt2d %%zmm8, %%zmm9, " r "\n"
#define KVS_PERMB(r) "vpermb " r ", %%zmm8, " r "\n"
#define KVS_SHUFI32X4(r) "vshufi32x4 $0x44, %%zmm8, " r ", " r "\n"
#define KVS_UNPCKLDQ(r) "vpunpckldq %%zmm8, " r ", " r "\n"
#define KVS_CVTDQ2PS(r) "vcvtdq2ps " r ", " r "\n"
#define KVS_SRLD512(r) "vpsrld $4, " r ", " r "\n"
#define KVS_ANDD512(r) "vpandd %%zmm8, " r ", " r "\n"
#define KVS_CVTPH512(r) "vcvtph2ps %%ymm8, " r "\n"
#define KVS_BCASTD512(r) "vpbroadcastd (%1), " r "\n"
// clang-format off
#define KVS_TURN512(A, B)                                                           \
  A("%%zmm0") B("%%zmm1") A("%%zmm2") B("%%zmm3") A("%%zmm4") B("%%zmm5")           \
  A("%%zmm6") B("%%zmm7") A("%%zmm10") B("%%zmm11") A("%%zmm12") B("%%zmm13")       \
  A("%%zmm14") B("%%zmm15")
// clang-format on
#define KVS_ISSUE_LOOP512(A, B) KVS_ISSUE_LOOP_OF(KVS_TURN512(A, B))

void BM_Issue512(benchmark::State& state, IssueLoop loop) {
  RunIssueLoop(state, loop, HasAvx512Readers(), "needs a CPU with AVX-512 VNNI, VBMI and BF16");
}

BENCHMARK_CAPTURE(BM_Issue512, vpdpbusd, KVS_ISSUE_LOOP512(KVS_DPBUSD, KVS_DPBUSD));
BENCHMARK_CAPTURE(BM_Issue512, vpdpbusd_bcst, KVS_ISSUE_LOOP512(KVS_DPBUSD_BCST, KVS_DPBUSD_BCST));
BENCHMARK_CAPTURE(BM_Issue512, vpdpwssd, KVS_ISSUE_LOOP512(KVS_DPWSSD, KVS_DPWSSD));
BENCHMARK_CAPTURE(BM_Issue512, vdpbf16ps, KVS_ISSUE_LOOP512(KVS_DPBF16, KVS_DPBF16));
BENCHMARK_CAPTURE(BM_Issue512, vfmadd231ps, KVS_ISSUE_LOOP512(KVS_FMA512, KVS_FMA512));
BENCHMARK_CAPTURE(BM_Issue512, vpermt2d, KVS_ISSUE_LOOP512(KVS_PERMT2D, KVS_PERMT2D));
BENCHMARK_CAPTURE(BM_Issue512, vpermb, KVS_ISSUE_LOOP512(KVS_PERMB, KVS_PERMB));
BENCHMARK_CAPTURE(BM_Issue512, vshufi32x4, KVS_ISSUE_LOOP512(KVS_SHUFI32X4, KVS_SHUFI32X4));
BENCHMARK_CAPTURE(BM_Issue512, vpunpckldq, KVS_ISSUE_LOOP512(KVS_UNPCKLDQ, KVS_UNPCKLDQ));
BENCHMARK_CAPTURE(BM_Issue512, vcvtdq2ps, KVS_ISSUE_LOOP512(KVS_CVTDQ2PS, KVS_CVTDQ2PS));
BENCHMARK_CAPTURE(BM_Issue512, vpsrld, KVS_ISSUE_LOOP512(KVS_SRLD512, KVS_SRLD512));
BENCHMARK_CAPTURE(BM_Issue512, vpandd, KVS_ISSUE_LOOP512(KVS_ANDD512, KVS_ANDD512));
BENCHMARK_CAPTURE(BM_Issue512, vcvtph2ps, KVS_ISSUE_LOOP512(KVS_CVTPH512, KVS_CVTPH512));
BENCHMARK_CAPTURE(BM_Issue512, vpbroadcastd_m32, KVS_ISSUE_LOOP512(KVS_BCASTD512, KVS_BCASTD512));
// The pairs the VNNI key pass (dot products beside the codes' masks and shifts, the columns'
// transposes, the scales' FMAs, query broadcasts) and the value pass (byte permutes) mix.
BENCHMARK_CAPTURE(BM_Issue512, vpdpbusd_vpandd, KVS_ISSUE_LOOP512(KVS_DPBUSD, KVS_ANDD512));
BENCHMARK_CAPTURE(BM_Issue512, vpdpbusd_vpsrld, KVS_ISSUE_LOOP512(KVS_DPBUSD, KVS_SRLD512));
BENCHMARK_CAPTURE(BM_Issue512, vpdpbusd_vpermt2d, KVS_ISSUE_LOOP512(KVS_DPBUSD, KVS_PERMT2D));
BENCHMARK_CAPTURE(BM_Issue512, vpdpbusd_vshufi32x4, KVS_ISSUE_LOOP512(KVS_DPBUSD, KVS_SHUFI32X4));
BENCHMARK_CAPTURE(BM_Issue512, vpdpbusd_vfmadd231ps, KVS_ISSUE_LOOP512(KVS_DPBUSD, KVS_FMA512));
BENCHMARK_CAPTURE(BM_Issue512, vpdpbusd_vpbroadcastd_m32,
                  KVS_ISSUE_LOOP512(KVS_DPBUSD, KVS_BCASTD512));
BENCHMARK_CAPTURE(BM_Issue512, vpdpbusd_vpermb, KVS_ISSUE_LOOP512(KVS_DPBUSD, KVS_PERMB));
BENCHMARK_CAPTURE(BM_Issue512, vdpbf16ps_vpandd, KVS_ISSUE_LOOP512(KVS_DPBF16, KVS_ANDD512));

// Stores, which the other loops have none of: each kind's 14 go to one 64-byte line (so they
// measure the store path, not the caches), alone and beside dot products. k1 holds the mask of
// 4 dwords that the readers' weight rows store (QuantiseQuadRows16). The VEX zeroing of xmm8
// clears zmm8, which the dot products read.
#define KVS_STORE512(r) "vmovdqu32 " r ", (%1)\n"
#define KVS_MASKED_STORE512(r) "vmovdqu32 " r ", (%1)%{%%k1%}\n"
#define KVS_EXTRACT128_STORE(r) "vextracti32x4 $1, " r ", (%1)\n"
#define KVS_EXTRACT256_STORE(r) "vextracti64x4 $1, " r ", (%1)\n"
// (The dot products' kind is AVX512_VNNI; the loop carries that target so that k1 may be named.)
#define KVS_STORE_TARGET __attribute__((target("avx512f,avx512vnni")))
#define KVS_STORE_LOOP512(A, B)                                                        \
  KVS_LOOP_OF(KVS_STORE_TARGET, "kxnorw %%k1, %%k1, %%k1\nkshiftrw $12, %%k1, %%k1\n", \
              KVS_TURN512(A, B), "k1")
BENCHMARK_CAPTURE(BM_Issue512, vmovdqu32_store, KVS_STORE_LOOP512(KVS_STORE512, KVS_STORE512));
BENCHMARK_CAPTURE(BM_Issue512, vmovdqu32_masked_store,
                  KVS_STORE_LOOP512(KVS_MASKED_STORE512, KVS_MASKED_STORE512));
BENCHMARK_CAPTURE(BM_Issue512, vextracti32x4_store,
                  KVS_STORE_LOOP512(KVS_EXTRACT128_STORE, KVS_EXTRACT128_STORE));
BENCHMARK_CAPTURE(BM_Issue512, vextracti64x4_store,
                  KVS_STORE_LOOP512(KVS_EXTRACT256_STORE, KVS_EXTRACT256_STORE));
BENCHMARK_CAPTURE(BM_Issue512, vpdpbusd_vmovdqu32_store,
                  KVS_STORE_LOOP512(KVS_DPBUSD, KVS_STORE512));
BENCHMARK_CAPTURE(BM_Issue512, vpdpbusd_vmovdqu32_masked_store,
                  KVS_STORE_LOOP512(KVS_DPBUSD, KVS_MASKED_STORE512));
BENCHMARK_CAPTURE(BM_Issue512, vpdpbusd_vextracti32x4_store,
                  KVS_STORE_LOOP512(KVS_DPBUSD, KVS_EXTRACT128_STORE));

#undef KVS_STORE_LOOP512
#undef KVS_STORE_TARGET
#undef KVS_EXTRACT256_STORE
#undef KVS_EXTRACT128_STORE
#undef KVS_MASKED_STORE512
#undef KVS_STORE512
#undef KVS_ISSUE_LOOP512
#undef KVS_TURN512
#undef KVS_BCASTD512
#undef KVS_CVTPH512
#undef KVS_ANDD512
#undef KVS_SRLD512
#undef KVS_CVTDQ2PS
#undef KVS_UNPCKLDQ
#undef KVS_SHUFI32X4
#undef KVS_PERMB
#undef KVS_PERMT2D
#undef KVS_FMA512
#undef KVS_DPBF16
#undef KVS_DPWSSD
#undef KVS_DPBUSD_BCST
#undef KVS_DPBUSD
#undef KVS_ISSUE_LOOP
#undef KVS_ISSUE_LOOP_OF
#undef KVS_LOOP_OF
#undef KVS_TURN
#undef KVS_UNPCKBW
#undef KVS_SLLW
#undef KVS_AND
#undef KVS_BCASTD
#undef KVS_CVTPH
#undef KVS_SHUFB
#undef KVS_SRLD
#undef KVS_ADDW
#undef KVS_MADDUBSW
#undef KVS_MADDWD
#undef KVS_FMA

#else  // not x86-64

void BM_Issue(benchmark::State& state) { state.SkipWithError("x86-64 only"); }
BENCHMARK(BM_Issue);

#endif

}  // namespace
}  // namespace kvstack

BENCHMARK_MAIN();
