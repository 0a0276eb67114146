/* What every kernel library shares of the CPU level: the level it is built for (native/cpu.py;
 * build.py passes -DTR_LEVEL=<n>), the check that the compiler was given that level's
 * instructions, and the mark of a function no other library sees.
 */
#ifndef TR_LEVEL_H
#define TR_LEVEL_H

#define TR_PLAIN 0
#define TR_AVX2 1
#define TR_AVX512 2
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

#define TR_INTERNAL __attribute__((visibility("hidden")))

#endif
