// A wall-clock sampling profiler of one thread, preloaded into a process: where the host spends
// the time of a decode step inside libmlx (the GPU machine has no perf and no gdb).
//
// A sampler thread sends SIGPROF every HPROF_US microseconds (default 200) to each thread whose
// name starts with HPROF_THREAD (default "mlex-engine"); the handler records the interrupted
// thread's stack (glibc backtrace). A thread blocked in a wait is sampled in its wait, so the
// profile shows waiting as well as work. At exit the samples and /proc/self/maps go to HPROF_OUT;
// scripts/hprof/report.py symbolizes them against the same binaries (libmlx keeps its .symtab).
//
//   gcc -O2 -shared -fPIC scripts/hprof/hprof.c -o /tmp/hprof.so -lpthread
//   LD_PRELOAD=/tmp/hprof.so HPROF_OUT=/tmp/hp.txt <command>
//   python3 scripts/hprof/report.py /tmp/hp.txt --lib libmlx.so=<path> --lib mlex=<unstripped binary>
#define _GNU_SOURCE
#include <dirent.h>
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define DEPTH 48
#define MAX_SAMPLES (1 << 18)

struct sample {
  int tid, n;
  void* pc[DEPTH];
};

static struct sample* samples;
static volatile int taken, stop;
static const char* want = "mlex-engine";
static int period_us = 200;

static void on_prof(int sig, siginfo_t* si, void* uc) {
  (void)sig, (void)si, (void)uc;
  int i = __atomic_fetch_add(&taken, 1, __ATOMIC_RELAXED);
  if (i >= MAX_SAMPLES) return;
  samples[i].tid = (int)syscall(SYS_gettid);
  samples[i].n = backtrace(samples[i].pc, DEPTH);
}

// The ids of this process's threads named `want...` (at most 64).
static int matching(int* tids) {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  if (!d) return 0;
  struct dirent* e;
  while ((e = readdir(d)) && n < 64) {
    if (e->d_name[0] == '.') continue;
    char path[300], name[32] = {0};
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
    FILE* f = fopen(path, "r");
    if (!f) continue;
    if (fgets(name, sizeof name, f) && strncmp(name, want, strlen(want)) == 0) tids[n++] = atoi(e->d_name);
    fclose(f);
  }
  closedir(d);
  return n;
}

static void* sampler(void* arg) {
  (void)arg;
  int tids[64], n = 0;
  pid_t pid = getpid();
  struct timespec ts = {0, period_us * 1000L};
  for (long tick = 0; !stop; tick++) {
    if (tick % 50 == 0) n = matching(tids);  // threads come and go: look again every 50 periods
    for (int i = 0; i < n; i++) syscall(SYS_tgkill, pid, tids[i], SIGPROF);
    nanosleep(&ts, NULL);
  }
  return NULL;
}

static void finish(void) {
  stop = 1;
  const char* path = getenv("HPROF_OUT");
  FILE* out = fopen(path ? path : "/tmp/hprof.txt", "w");
  if (!out) return;
  int n = taken < MAX_SAMPLES ? taken : MAX_SAMPLES;
  fprintf(out, "# hprof period_us %d thread %s samples %d\n", period_us, want, n);
  for (int i = 0; i < n; i++) {
    fprintf(out, "S %d", samples[i].tid);
    for (int j = 0; j < samples[i].n; j++) fprintf(out, " %lx", (unsigned long)samples[i].pc[j]);
    fputc('\n', out);
  }
  FILE* maps = fopen("/proc/self/maps", "r");
  char line[4096];
  while (maps && fgets(line, sizeof line, maps)) fprintf(out, "M %s", line);
  if (maps) fclose(maps);
  fclose(out);
}

__attribute__((constructor)) static void start(void) {
  if (getenv("HPROF_THREAD")) want = getenv("HPROF_THREAD");
  if (getenv("HPROF_US")) period_us = atoi(getenv("HPROF_US"));
  if (period_us < 20) period_us = 20;
  samples = calloc(MAX_SAMPLES, sizeof *samples);
  if (!samples) return;
  void* warm[4];
  backtrace(warm, 4);  // loads the unwinder now, not inside the first signal
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_prof;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigaction(SIGPROF, &sa, NULL);
  pthread_t t;
  pthread_create(&t, NULL, sampler, NULL);
  pthread_detach(t);
  atexit(finish);
}
