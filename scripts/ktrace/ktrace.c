// CUDA injection library: records every kernel's GPU start/end (CUPTI activity API) and the
// driver calls the host makes, for a decode timeline without Nsight Systems. Build and use:
//   gcc -O2 -shared -fPIC -DKREC=CUpti_ActivityKernel10 -I$CUDA/include ktrace.c -o ktrace.so -L$CUDA/lib -lcupti
//   CUDA_INJECTION64_PATH=$PWD/ktrace.so KTRACE_OUT=/tmp/kt.txt <command>; python3 report.py /tmp/kt.txt
// (KREC: the newest CUpti_ActivityKernelN of the installed CUPTI headers.)
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifndef KREC
#define KREC CUpti_ActivityKernel9
#endif
static FILE* out;
static void CUPTIAPI req(uint8_t** b, size_t* s, size_t* m) { *s = 16 << 20; *b = aligned_alloc(8, *s); *m = 0; }
static void CUPTIAPI done(CUcontext c, uint32_t sid, uint8_t* b, size_t s, size_t valid) {
  CUpti_Activity* r = NULL;
  while (cuptiActivityGetNextRecord(b, valid, &r) == CUPTI_SUCCESS) {
    if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
      KREC* k = (KREC*)r;
      fprintf(out, "K %llu %llu %u %s\n", (unsigned long long)k->start, (unsigned long long)k->end, k->streamId, k->name);
    } else if (r->kind == CUPTI_ACTIVITY_KIND_DRIVER) {
      CUpti_ActivityAPI* a = (CUpti_ActivityAPI*)r;
      fprintf(out, "D %llu %llu %u %u\n", (unsigned long long)a->start, (unsigned long long)a->end, a->cbid, a->threadId);
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      CUpti_ActivityMemcpy6* m = (CUpti_ActivityMemcpy6*)r;
      fprintf(out, "M %llu %llu %u %llu\n", (unsigned long long)m->start, (unsigned long long)m->end, m->streamId, (unsigned long long)m->bytes);
    }
  }
  free(b);
}
static void fin(void) { cuptiActivityFlushAll(1); if (out) fclose(out); }
int InitializeInjection(void) {
  out = fopen(getenv("KTRACE_OUT") ? getenv("KTRACE_OUT") : "/tmp/ktrace.txt", "w");
  cuptiActivityRegisterCallbacks(req, done);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
  atexit(fin);
  return 1;
}
