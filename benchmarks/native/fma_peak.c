/* Single-core float32 FMA throughput: CHAINS independent vector multiply-add chains, so the FMA units,
   not the latency of one chain, limit the loop. Built with the host's widest vectors (-march=native) by
   benchmarks/vs_pytorch.py; prints GFLOP/s. Each chain does acc = acc * a + b on VLEN floats (2 flops per
   lane); a and b come from argv so the compiler cannot fold the loop. Every lane's b is nonzero: with b = 0
   a lane decays as a^n and turns subnormal after about 87 million iterations, and Intel cores take a
   microcode assist for each subnormal FMA (a 200-million-iteration run read 0.9 instead of 121 GFLOP/s on
   a Xeon; AMD cores handle subnormals at full speed, so figures taken there stand). Each lane converges to
   b / (1 - a), far from the subnormal range. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define VLEN 16
#define CHAINS 12
typedef float vec __attribute__((vector_size(VLEN * sizeof(float))));

int main(int argc, char **argv) {
    long iterations = argc > 1 ? atol(argv[1]) : 100000000L;
    float scale = argc > 2 ? (float)atof(argv[2]) : 0.999999f;
    vec a, b, acc[CHAINS];
    for (int l = 0; l < VLEN; l++) { a[l] = scale; b[l] = 1e-7f * (float)(l + 1); }
    for (int c = 0; c < CHAINS; c++) acc[c] = b + (float)c;
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long i = 0; i < iterations; i++)
        for (int c = 0; c < CHAINS; c++) acc[c] = acc[c] * a + b;
    clock_gettime(CLOCK_MONOTONIC, &end);
    float sum = 0;
    for (int c = 0; c < CHAINS; c++) for (int l = 0; l < VLEN; l++) sum += acc[c][l];
    double seconds = (double)(end.tv_sec - start.tv_sec) + 1e-9 * (double)(end.tv_nsec - start.tv_nsec);
    double flops = 2.0 * VLEN * CHAINS * (double)iterations;
    printf("%.3f %.6f %g\n", flops / seconds / 1e9, seconds, (double)sum);
    return 0;
}
