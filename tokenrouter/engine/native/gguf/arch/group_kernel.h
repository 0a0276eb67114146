/* group_kernel for a vector level: included by each arch/ file after its own group_q45k, group_q6k
 * and group_q32, which it calls with the type and the rows (1-4) made constants, so that each copy
 * keeps its sums in registers. */
/* One group against `mt` rows of x, `mt` a constant in each copy so the sums stay in registers. */
TR_INTERNAL void group_kernel(int type, const uint8_t *g, const QuantX *x, int64_t K, int64_t m0, int mt, float *out) {
    const int ahead = m0 == 0;
#define ROWS(n)                                                                                                        \
    case n:                                                                                                            \
        switch (type) {                                                                                                \
        case TYPE_Q4_K: group_q45k(TYPE_Q4_K, g, x, K, m0, n, ahead, out); break;                                      \
        case TYPE_Q5_K: group_q45k(TYPE_Q5_K, g, x, K, m0, n, ahead, out); break;                                      \
        case TYPE_Q6_K: group_q6k(g, x, K, m0, n, ahead, out); break;                                                  \
        case TYPE_Q8_0: group_q32(TYPE_Q8_0, g, x, K, m0, n, ahead, out); break;                                       \
        case TYPE_Q4_0: group_q32(TYPE_Q4_0, g, x, K, m0, n, ahead, out); break;                                       \
        case TYPE_Q4_1: group_q32(TYPE_Q4_1, g, x, K, m0, n, ahead, out); break;                                       \
        case TYPE_Q5_0: group_q32(TYPE_Q5_0, g, x, K, m0, n, ahead, out); break;                                       \
        default: group_q32(TYPE_Q5_1, g, x, K, m0, n, ahead, out); break;                                              \
        }                                                                                                              \
        break;
    switch (mt) { ROWS(1) ROWS(2) ROWS(3) ROWS(4) }
#undef ROWS
}
