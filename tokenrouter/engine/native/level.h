/* What every kernel library shares of the CPU level: the level it is built for (native/cpu.py;
 * build.py passes -DTR_LEVEL=<n>), the check that the compiler was given that level's
 * instructions, and the mark of a function no other library sees.
 */
#ifndef TR_LEVEL_H
#define TR_LEVEL_H

/* One number per level across architectures (cpu.py's ALL_LEVELS, in this order): x86's, then ARM64's. */
#define TR_PLAIN 0
#define TR_AVX2 1
#define TR_AVX512 2
#define TR_NEON 3    /* ARMv8-A's Advanced SIMD: every ARM64 CPU */
#define TR_DOTPROD 4 /* ARMv8.2-A's dot product (sdot, udot): vdotq_s32 */
#define TR_I8MM 5    /* ARMv8.6-A's int8 matrix multiply (smmla, usmmla): vmmlaq_s32, with dotprod */
#ifndef TR_LEVEL
#define TR_LEVEL TR_PLAIN
#endif
#if TR_LEVEL == TR_AVX512 && !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) &&              \
                               defined(__AVX512VNNI__) && defined(__F16C__) && defined(__FMA__))
#error "TR_LEVEL 2 needs AVX512 F, BW, VL and VNNI, F16C and FMA (-march=x86-64-v4 -mavx512vnni)"
#endif
#if TR_LEVEL == TR_AVX2 && !(defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#error "TR_LEVEL 1 needs AVX2, FMA and F16C (-march=x86-64-v3)"
#endif

#if TR_LEVEL >= TR_NEON && !(defined(__aarch64__) && defined(__ARM_NEON))
#error "TR_LEVEL 3-5 are ARM64's: they need aarch64 with NEON"
#endif
#if TR_LEVEL >= TR_DOTPROD && !defined(__ARM_FEATURE_DOTPROD)
#error "TR_LEVEL 4 needs the dot product extension (-march=armv8.2-a+dotprod)"
#endif
#if TR_LEVEL == TR_I8MM && !defined(__ARM_FEATURE_MATMUL_INT8)
#error "TR_LEVEL 5 needs dotprod and i8mm (-march=armv8.2-a+dotprod+i8mm)"
#endif
#define TR_ARM (TR_LEVEL >= TR_NEON) /* one of ARM64's vector levels */

#define TR_INTERNAL __attribute__((visibility("hidden")))

#endif
