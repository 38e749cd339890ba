/* FakeQuant for onnxruntime: y = round(clamp(x / s, lo, hi)) * s in one pass over x.
 *
 * The values are those of QuantizeLinear followed by DequantizeLinear (x / s, rounding half to
 * even, saturation to the integer range shifted by the zero point), which take two passes and an
 * integer tensor in between. tuner/runtime/fakequant.py builds this file into a shared library
 * for onnxruntime's custom-op loader and checks it against that pair before using it.
 *
 * Inputs: X (float), S (float, one scale, or one per channel along `axis`).
 * Attributes: lo, hi (float; qmin - zero_point, qmax - zero_point), axis (int, default 1).
 *
 * No onnxruntime header is needed: the C API is a table of function pointers whose order never
 * changes (new entries are only appended), reached through the OrtApiBase that onnxruntime hands
 * to RegisterCustomOps. The positions and the OrtCustomOp layout below are those documented for
 * onnxruntime's C API; fakequant.py's self-check runs every one of them before the library is used.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct OrtStatus OrtStatus;
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtValue OrtValue;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;

typedef struct OrtApi { void *fn[1]; } OrtApi;
typedef struct OrtApiBase {
  const OrtApi *(*GetApi)(uint32_t version);
  const char *(*GetVersionString)(void);
} OrtApiBase;

/* Positions in the OrtApi table (API version 1 has them all). */
enum {
  API_CreateCustomOpDomain = 26,
  API_CustomOpDomain_Add = 27,
  API_AddCustomOpDomain = 28,
  API_GetTensorMutableData = 51,
  API_GetDimensionsCount = 61,
  API_GetDimensions = 62,
  API_GetTensorShapeElementCount = 64,
  API_GetTensorTypeAndShape = 65,
  API_KernelInfoGetAttribute_float = 85,
  API_KernelInfoGetAttribute_int64 = 86,
  API_KernelContext_GetInput = 90,
  API_KernelContext_GetOutput = 91,
  API_ReleaseStatus = 93,
  API_ReleaseTensorTypeAndShapeInfo = 99,
};

typedef OrtStatus *(*CreateCustomOpDomain_t)(const char *, OrtCustomOpDomain **);
typedef OrtStatus *(*CustomOpDomain_Add_t)(OrtCustomOpDomain *, const void *);
typedef OrtStatus *(*AddCustomOpDomain_t)(OrtSessionOptions *, OrtCustomOpDomain *);
typedef OrtStatus *(*GetTensorMutableData_t)(OrtValue *, void **);
typedef OrtStatus *(*GetDimensionsCount_t)(const OrtTensorTypeAndShapeInfo *, size_t *);
typedef OrtStatus *(*GetDimensions_t)(const OrtTensorTypeAndShapeInfo *, int64_t *, size_t);
typedef OrtStatus *(*GetTensorShapeElementCount_t)(const OrtTensorTypeAndShapeInfo *, size_t *);
typedef OrtStatus *(*GetTensorTypeAndShape_t)(const OrtValue *, OrtTensorTypeAndShapeInfo **);
typedef OrtStatus *(*KernelInfoGetAttribute_float_t)(const OrtKernelInfo *, const char *, float *);
typedef OrtStatus *(*KernelInfoGetAttribute_int64_t)(const OrtKernelInfo *, const char *, int64_t *);
typedef OrtStatus *(*KernelContext_GetInput_t)(const OrtKernelContext *, size_t, const OrtValue **);
typedef OrtStatus *(*KernelContext_GetOutput_t)(OrtKernelContext *, size_t, const int64_t *, size_t, OrtValue **);
typedef void (*ReleaseStatus_t)(OrtStatus *);
typedef void (*ReleaseTensorTypeAndShapeInfo_t)(OrtTensorTypeAndShapeInfo *);

#define CALL(api, name) (*(name##_t)((api)->fn[API_##name]))

/* OrtCustomOp as of API version 17 (later versions only append fields, read by version). */
typedef struct OrtCustomOp {
  uint32_t version;
  void *(*CreateKernel)(const struct OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info);
  const char *(*GetName)(const struct OrtCustomOp *op);
  const char *(*GetExecutionProviderType)(const struct OrtCustomOp *op);
  int (*GetInputType)(const struct OrtCustomOp *op, size_t index);
  size_t (*GetInputTypeCount)(const struct OrtCustomOp *op);
  int (*GetOutputType)(const struct OrtCustomOp *op, size_t index);
  size_t (*GetOutputTypeCount)(const struct OrtCustomOp *op);
  void (*KernelCompute)(void *kernel, OrtKernelContext *context);
  void (*KernelDestroy)(void *kernel);
  int (*GetInputCharacteristic)(const struct OrtCustomOp *op, size_t index);
  int (*GetOutputCharacteristic)(const struct OrtCustomOp *op, size_t index);
  int (*GetInputMemoryType)(const struct OrtCustomOp *op, size_t index);
  int (*GetVariadicInputMinArity)(const struct OrtCustomOp *op);
  int (*GetVariadicInputHomogeneity)(const struct OrtCustomOp *op);
  int (*GetVariadicOutputMinArity)(const struct OrtCustomOp *op);
  int (*GetVariadicOutputHomogeneity)(const struct OrtCustomOp *op);
  void *CreateKernelV2;
  void *KernelComputeV2;
  void *InferOutputShapeFn;
  int (*GetStartVersion)(const struct OrtCustomOp *op);
  int (*GetEndVersion)(const struct OrtCustomOp *op);
} OrtCustomOp;

enum { TENSOR_FLOAT = 1, MAX_RANK = 16 };

typedef struct {
  const OrtApi *api;
  float lo, hi;
  int64_t axis;
} Kernel;

/* Releases a status; 1 when there was none (success). */
static int ok(const OrtApi *api, OrtStatus *status) {
  if (status == NULL) return 1;
  CALL(api, ReleaseStatus)(status);
  return 0;
}

static void *create_kernel(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info) {
  (void)op;
  Kernel *k = (Kernel *)calloc(1, sizeof(Kernel));
  if (k == NULL) return NULL;
  k->api = api;
  k->lo = -128.0f;
  k->hi = 127.0f;
  k->axis = 1;
  ok(api, CALL(api, KernelInfoGetAttribute_float)(info, "lo", &k->lo));
  ok(api, CALL(api, KernelInfoGetAttribute_float)(info, "hi", &k->hi));
  ok(api, CALL(api, KernelInfoGetAttribute_int64)(info, "axis", &k->axis));
  return k;
}

/* Not inlined: one vectorised loop (roundps/vrndscaleps for nearbyintf) serves both callers. */
static __attribute__((noinline)) void fake_quant(const float *restrict x, float *restrict y, size_t n, float s,
                                                 float lo, float hi) {
  for (size_t i = 0; i < n; ++i) {
    float v = x[i] / s;
    v = v < lo ? lo : (v > hi ? hi : v);
    y[i] = nearbyintf(v) * s + 0.0f; /* + 0.0f: -0.0 becomes 0.0, as DequantizeLinear's (q - zp) * s gives */
  }
}

static size_t element_count(const OrtApi *api, const OrtValue *value, int64_t *dims, size_t *rank) {
  OrtTensorTypeAndShapeInfo *info = NULL;
  size_t count = 0;
  if (!ok(api, CALL(api, GetTensorTypeAndShape)(value, &info))) return 0;
  if (dims != NULL) {
    ok(api, CALL(api, GetDimensionsCount)(info, rank));
    if (*rank > MAX_RANK) *rank = 0;
    ok(api, CALL(api, GetDimensions)(info, dims, *rank));
  }
  ok(api, CALL(api, GetTensorShapeElementCount)(info, &count));
  CALL(api, ReleaseTensorTypeAndShapeInfo)(info);
  return count;
}

static void compute(void *kernel, OrtKernelContext *ctx) {
  const Kernel *k = (const Kernel *)kernel;
  const OrtApi *api = k->api;
  const OrtValue *xv = NULL, *sv = NULL;
  OrtValue *yv = NULL;
  int64_t dims[MAX_RANK];
  size_t rank = 0;
  float *x = NULL, *s = NULL, *y = NULL;
  if (!ok(api, CALL(api, KernelContext_GetInput)(ctx, 0, &xv)) ||
      !ok(api, CALL(api, KernelContext_GetInput)(ctx, 1, &sv)))
    return;
  size_t count = element_count(api, xv, dims, &rank);
  size_t scales = element_count(api, sv, NULL, NULL);
  if (!ok(api, CALL(api, KernelContext_GetOutput)(ctx, 0, dims, rank, &yv))) return;
  ok(api, CALL(api, GetTensorMutableData)((OrtValue *)xv, (void **)&x));
  ok(api, CALL(api, GetTensorMutableData)((OrtValue *)sv, (void **)&s));
  ok(api, CALL(api, GetTensorMutableData)(yv, (void **)&y));
  if (x == NULL || s == NULL || y == NULL || scales == 0) return;
  if (scales == 1) {
    fake_quant(x, y, count, s[0], k->lo, k->hi);
    return;
  }
  int64_t axis = k->axis < 0 ? k->axis + (int64_t)rank : k->axis;
  if (axis < 0 || axis >= (int64_t)rank || (size_t)dims[axis] != scales) return;
  size_t outer = 1, inner = 1, channels = (size_t)dims[axis];
  for (int64_t d = 0; d < axis; ++d) outer *= (size_t)dims[d];
  for (size_t d = (size_t)axis + 1; d < rank; ++d) inner *= (size_t)dims[d];
  for (size_t o = 0; o < outer; ++o)
    for (size_t c = 0; c < channels; ++c) {
      size_t at = (o * channels + c) * inner;
      fake_quant(x + at, y + at, inner, s[c], k->lo, k->hi);
    }
}

static void destroy(void *kernel) { free(kernel); }
static const char *name(const OrtCustomOp *op) { (void)op; return "FakeQuant"; }
static const char *provider(const OrtCustomOp *op) { (void)op; return "CPUExecutionProvider"; }
static int float_type(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return TENSOR_FLOAT; }
static size_t two(const OrtCustomOp *op) { (void)op; return 2; }
static size_t one(const OrtCustomOp *op) { (void)op; return 1; }
static int required(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return 0; }  /* INPUT_OUTPUT_REQUIRED */
static int cpu_memory(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return 0; }  /* OrtMemTypeDefault */
static int one_int(const OrtCustomOp *op) { (void)op; return 1; }
static int any_version(const OrtCustomOp *op) { (void)op; return 0x7fffffff; }

static OrtCustomOp fake_quant_op = {
    17, create_kernel, name, provider, float_type, two, float_type, one, compute, destroy,
    required, required, cpu_memory, one_int, one_int, one_int, one_int,
    NULL, NULL, NULL, one_int, any_version,
};

__attribute__((visibility("default"))) OrtStatus *RegisterCustomOps(OrtSessionOptions *options,
                                                                   const OrtApiBase *base) {
  const OrtApi *api = base->GetApi(1);
  OrtCustomOpDomain *domain = NULL;
  OrtStatus *status = CALL(api, CreateCustomOpDomain)("tuner.sim", &domain);
  if (status != NULL) return status;
  status = CALL(api, CustomOpDomain_Add)(domain, &fake_quant_op);
  if (status != NULL) return status;
  return CALL(api, AddCustomOpDomain)(options, domain);
}
