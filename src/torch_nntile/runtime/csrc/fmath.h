/* Float functions without libm calls, so that loops over them vectorize. */
#ifndef TNT_FMATH_H
#define TNT_FMATH_H

#include <math.h>
#include <stdint.h>

/* exp, tanh and the logistic function without libm calls, so that the loops over a
   block vectorize: exp by n ln 2 + r range reduction and a degree-6 polynomial (about
   1 ulp), tanh from it (a polynomial near 0, where 1 - 2 / (e^2x + 1) would cancel). */
static inline __attribute__((always_inline)) float fexp(float x)
{
    float big = x > 88.72283935546875f;  /* past FLT_MAX */
    float zero = x < -103.97207641601562f;  /* below half the smallest subnormal (-inf included) */
    x = x < -103.9f ? -103.9f : x > 88.8f ? 88.8f : x;
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  /* round to nearest */
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    /* 2^n in two factors: n reaches -150 at the bottom, below the normal exponents */
    int32_t ni = (int32_t)n, h = ni >> 1;
    union { int32_t i; float f; } a = { (h + 127) << 23 }, b = { (ni - h + 127) << 23 };
    float e = p * a.f * b.f;
    return big ? __builtin_inff() : zero ? 0.0f : e;
}

static inline __attribute__((always_inline)) float ftanh(float x)
{
    float ax = fabsf(x), z = x * x;
    float p = -5.70498872745e-3f;
    p = p * z + 2.06390887954e-2f;
    p = p * z - 5.37397155531e-2f;
    p = p * z + 1.33314422036e-1f;
    p = p * z - 3.33332819422e-1f;
    float small = x + x * z * p;
    float t = 1.0f - 2.0f / (fexp(2.0f * (ax > 10.0f ? 10.0f : ax)) + 1.0f);  /* 1 from 9.01 on */
    float large = x < 0 ? -t : t;
    return ax < 0.625f ? small : ax == ax ? large : x;  /* NaN stays NaN */
}

#endif
