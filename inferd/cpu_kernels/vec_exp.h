/* e^x in plain arithmetic, for loops the compiler vectorises (inferd). A call to expf or tanhf
 * keeps a loop scalar, and GELU and SiLU over a decode step's MLP rows and the softmax over a
 * sequence's keys are loops over thousands of values per layer.
 *
 * e^x = 2^k e^r with k = x / ln 2 rounded to an integer and |r| <= ln 2 / 2; ln 2 is split in a
 * part exact in float and a small rest, so that r carries no rounding of k ln 2; e^r is its
 * Taylor series to r^7 (truncation below 3e-9 there, under float's own rounding); 2^k is built
 * in the exponent bits. x is clamped to [-87, 88] so that 2^k stays a normal float: e^-87 is
 * already below 2e-38, and no caller needs e^x beyond e^88.
 *
 * NOTE: the clamps are selects, which the compiler vectorises only under -fno-trapping-math
 * (build.py passes it; it changes no result). Same bits for every element whichever lanes or
 * remainder loop compute it (no contraction under -std=c11), so a row's result does not depend
 * on how many rows a step has. */
#ifndef INFERD_VEC_EXP_H
#define INFERD_VEC_EXP_H
#include <stdint.h>
#include <string.h>

static inline float inferd_exp(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    const float round = 12582912.0f; /* 1.5 * 2^23: adding and taking it away rounds to an integer */
    const float k = (x * 1.44269504088896341f + round) - round;
    const float r = (x - k * 0.693145751953125f) - k * 1.42860682028622680e-6f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t bits = ((int32_t)k + 127) << 23;
    float two_k;
    memcpy(&two_k, &bits, sizeof two_k);
    return p * two_k;
}
#endif
