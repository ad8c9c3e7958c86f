// A shared header for sample.cu, found through the kernels folder's -I as common.cuh is.
#pragma once
#include <cuda_fp16.h>

#define SAMPLE_THREADS 256
