/* qkv's C API: attention, the multi-head layer and the KV cache, for C and for any language
 * with a C foreign-function interface. It sits on the C++ API (qkv/qkv.h) and means the same
 * things; docs/c_api.md states the ABI rules.
 *
 * - Every function that can fail returns a qkv_status; qkv_last_error() then gives one line
 *   naming the subject ("k: expected ..."). Nothing throws across this boundary, prints or
 *   aborts: a NULL pointer or a bad shape is QKV_ERROR_INVALID_ARGUMENT.
 * - Structs start with `struct_size`, which the caller sets to sizeof the struct it was compiled
 *   with (the _init functions below do). Fields are only ever appended: the library reads the
 *   fields that fit in struct_size and takes the defaults for the rest, so a binary built
 *   against an older header keeps working. A struct_size below the first version's size is
 *   refused; one beyond this library's sizeof is accepted only if the bytes this library does
 *   not know are all zero (a newer client asking for nothing new).
 * - Tensors are described, not copied: a qkv_tensor points at the caller's memory, which must
 *   stay valid for the call. Results whose shape the library computes come back in an opaque
 *   qkv_result that owns its memory (qkv_result_free).
 * - Thread safety is the C++ API's: independent calls may run concurrently; a KV cache takes
 *   concurrent calls on distinct sequences only. The error message is per thread.
 */
#ifndef QKV_QKV_C_H_
#define QKV_QKV_C_H_

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum qkv_status {
  QKV_OK = 0,
  QKV_ERROR_INVALID_ARGUMENT = 1, /* bad input: NULL, shape, dtype, option, unknown kernel */
  QKV_ERROR_FILE = 2,             /* a file could not be read (qkv_read_npy) */
  QKV_ERROR_OUT_OF_MEMORY = 3,    /* an allocation failed */
  QKV_ERROR_LIMIT = 4,            /* a bound the caller set: max_memory, the cache's capacity */
  QKV_ERROR_INTERNAL = 5          /* anything else: a bug in qkv */
} qkv_status;

/* "QKV_OK", "QKV_ERROR_INVALID_ARGUMENT", ...; "unknown status" for other values. */
const char* qkv_status_name(qkv_status status);
/* The message of the most recent failed call on this thread ("" after a successful one). Valid
 * until the next qkv_ call on this thread. */
const char* qkv_last_error(void);
/* The library's version, e.g. "0.1.0". */
const char* qkv_version(void);
/* Runs qkv's threads on an OpenMP runtime this process has already loaded (a path, or a file name
 * the dynamic loader knows such as "libgomp.so.1"), instead of on qkv's own threads; NULL or ""
 * goes back to qkv's own. For a host program whose own OpenMP workers keep spinning between its
 * parallel regions on the cores qkv would need (torch's do). Same results either way;
 * process-wide. QKV_ERROR_INVALID_ARGUMENT when the library is not loaded or is not an OpenMP
 * runtime (qkv never loads one); the choice is then unchanged. */
qkv_status qkv_use_openmp_threads(const char* library);

/* The element types of qkv::DType. BF16 and F16 are storage types (widened to float32 as read);
 * I32 and I64 serve sequence offsets only. QKV_DTYPE_DEFAULT is meaningful only in
 * qkv_attention_options.dtype. */
typedef enum qkv_dtype {
  QKV_DTYPE_DEFAULT = -1,
  QKV_F32 = 0,
  QKV_F64 = 1,
  QKV_BOOL = 2,
  QKV_BF16 = 3,
  QKV_F16 = 4,
  QKV_I32 = 5,
  QKV_I64 = 6
} qkv_dtype;

#define QKV_MAX_RANK 32

/* A view of the caller's memory. `strides` are in elements (0 broadcasts; NULL means C order);
 * `name` (NULL: the argument's name, e.g. "q") is the subject of any error about the tensor.
 * Outputs are written through `data`; inputs are only read. */
typedef struct qkv_tensor {
  size_t struct_size; /* sizeof(qkv_tensor) */
  void* data;
  qkv_dtype dtype;
  int32_t rank; /* 0 .. QKV_MAX_RANK */
  const int64_t* shape;
  const int64_t* strides;
  const char* name;
} qkv_tensor;

/* qkv::AttentionOptions. Zero means "off" or "default" everywhere except `dtype` and
 * `grad_dtype` (QKV_DTYPE_DEFAULT), so the _init function is the reliable way to start. */
typedef struct qkv_attention_options {
  size_t struct_size;
  /* Version 1: the options of the command-line contract's version 1. */
  int32_t has_scale; /* 0: scale = 1/sqrt(D) */
  double scale;
  int32_t causal; /* key j allowed iff j <= i + (Nk - Nq) */
  int32_t has_window;
  int64_t window_left;     /* -1: unbounded */
  int64_t window_right;    /* -1: unbounded */
  const qkv_tensor* mask;  /* bool (true = may attend) or float (added), broadcast; NULL: none */
  int32_t return_weights;  /* result-handle calls only; qkv_attention_into takes `weights` */
  int32_t return_lse;      /* result-handle calls only; qkv_attention_into takes `lse` */
  qkv_dtype out_dtype;     /* F32, F64 or F16; result-handle calls only */
  int32_t threads;         /* 0: one per hardware thread (fewer for a small call) */
  const char* kernel;      /* NULL or "": the fastest kernel that supports the call */
  uint64_t max_memory;     /* bytes the call may allocate; 0: no limit */
  /* Version 2: storage type and score modifiers. */
  qkv_dtype dtype;                 /* storage type of Q, K, V; QKV_DTYPE_DEFAULT: as stored */
  double softcap;                  /* C > 0: C·tanh(x / C) on the scaled scores; 0: off */
  int32_t alibi;                   /* the standard ALiBi slopes for H heads */
  const qkv_tensor* alibi_slopes;  /* float [H]; NULL: none */
  const qkv_tensor* sinks;         /* float [H]; NULL: none */
  const qkv_tensor* cu_seqlens_q;  /* int32/int64 [B+1]: a packed batch; both or neither */
  const qkv_tensor* cu_seqlens_k;
  /* Version 3: attention dropout (training). Each weight is dropped with probability
   * dropout_p in [0, 1) (rounded to a multiple of 2^-16) and the kept ones are scaled by
   * 1/(1 - dropout_p); the mask is Philox4x32-10 of (seed, dropout_offset, batch, head, row,
   * key), the same for any thread count, drawn again by qkv_attention_backward given the same
   * values. Weights returned are those after dropout. 0: no dropout. */
  double dropout_p;
  uint64_t seed;
  uint32_t dropout_offset;
  /* Version 4: the gradients' dtype (qkv_attention_backward). QKV_DTYPE_DEFAULT: the compute
   * type's (BF16 for a bf16 call, F64 for float64, else F32); QKV_F32 asks a bf16 call for its
   * float32 sums. */
  qkv_dtype grad_dtype;
} qkv_attention_options;

/* The smallest struct_size accepted: the version 1 fields. */
#define QKV_ATTENTION_OPTIONS_V1_SIZE offsetof(qkv_attention_options, dtype)
/* The version 2 fields' end (a client built before dropout). */
#define QKV_ATTENTION_OPTIONS_V2_SIZE offsetof(qkv_attention_options, dropout_p)
/* The version 3 fields' end (a client built before grad_dtype). */
#define QKV_ATTENTION_OPTIONS_V3_SIZE offsetof(qkv_attention_options, grad_dtype)

/* Inline so that struct_size is the caller's sizeof, never a newer library's. */
static inline void qkv_attention_options_init(qkv_attention_options* options) {
  memset(options, 0, sizeof *options);
  options->struct_size = sizeof *options;
  options->window_left = -1;
  options->window_right = -1;
  options->out_dtype = QKV_F32;
  options->dtype = QKV_DTYPE_DEFAULT;
  options->grad_dtype = QKV_DTYPE_DEFAULT;
}

/* What a call computed, owned by the library. Parts: */
typedef enum qkv_result_part {
  QKV_RESULT_OUT = 0,
  QKV_RESULT_WEIGHTS = 1, /* present when options.return_weights */
  QKV_RESULT_LSE = 2,     /* present when options.return_lse */
  /* qkv_attention_backward's: the gradients (DSINKS only with options.sinks) */
  QKV_RESULT_DQ = 3,
  QKV_RESULT_DK = 4,
  QKV_RESULT_DV = 5,
  QKV_RESULT_DSINKS = 6,
  /* qkv_layer_backward's: dX, the memory's (with one), each weight's (where given), and
   * QKV_RESULT_DSINKS (with options.attention->sinks) */
  QKV_RESULT_DX = 7,
  QKV_RESULT_DMEMORY = 8,
  QKV_RESULT_DWQ = 9,
  QKV_RESULT_DWK = 10,
  QKV_RESULT_DWV = 11,
  QKV_RESULT_DWO = 12,
  QKV_RESULT_DBQ = 13,
  QKV_RESULT_DBK = 14,
  QKV_RESULT_DBV = 15,
  QKV_RESULT_DBO = 16
} qkv_result_part;

typedef struct qkv_result qkv_result;

/* Fills `view` (whose struct_size the caller sets) with a C-order view of one part: data, dtype,
 * rank, shape (strides NULL), name. The pointers stay valid until qkv_result_free. A part the
 * call did not produce is QKV_ERROR_INVALID_ARGUMENT. */
qkv_status qkv_result_tensor(const qkv_result* result, qkv_result_part part, qkv_tensor* view);
/* The kernel that ran ("" for qkv_read_npy); valid until qkv_result_free. NULL for NULL. */
const char* qkv_result_kernel(const qkv_result* result);
void qkv_result_free(qkv_result* result); /* NULL is fine */

/* softmax(scale · Q·K^T + mask)·V into the caller's memory: `out` [.., Nq, Dv], and when not
 * NULL `weights` [.., Nq, Nk] and `lse` [.., Nq], each float32 or float64, any strides. `options`
 * NULL means defaults. Bad input leaves every output untouched; only QKV_ERROR_OUT_OF_MEMORY from
 * a kernel's workspace may come after rows were written. */
qkv_status qkv_attention_into(const qkv_tensor* q, const qkv_tensor* k, const qkv_tensor* v,
                              const qkv_attention_options* options, const qkv_tensor* out,
                              const qkv_tensor* weights, const qkv_tensor* lse);
/* The same, into a new result (parts as options.return_weights / return_lse / out_dtype). */
qkv_status qkv_attention(const qkv_tensor* q, const qkv_tensor* k, const qkv_tensor* v,
                         const qkv_attention_options* options, qkv_result** result);

/* The gradients of sum(out ∘ grad_out) with respect to Q, K, V (and the sinks), for `out` and
 * `lse` that qkv_attention returned on the same inputs and options (return_lse); grad_out has
 * out's shape. Every option of the forward is honoured; the result's parts are QKV_RESULT_DQ,
 * _DK, _DV (each of its input's shape; a kv head's dK and dV sum over its query heads) and
 * _DSINKS ([H], with options.sinks), of options.grad_dtype: by default float32, float64 when the
 * call computes in float64, bf16 when it computes in bf16 (options.dtype = QKV_BF16, or Q, K, V
 * all stored in it: bf16 dot products, float32 sums and softmax, P and dS rounded to bf16 as
 * operands; grad_dtype = QKV_F32 gives the float32 sums). f16 storage is refused (set
 * options.dtype = QKV_F32 or QKV_BF16). options.kernel names a backward
 * kernel ("fused_hwy", "unfused_blas", "fused_scalar", "reference"). Bitwise the same for any
 * thread count. */
qkv_status qkv_attention_backward(const qkv_tensor* q, const qkv_tensor* k, const qkv_tensor* v,
                                  const qkv_tensor* out, const qkv_tensor* lse,
                                  const qkv_tensor* grad_out,
                                  const qkv_attention_options* options, qkv_result** result);

/* The layer, X·W convention: wq [d, H·dk], wk [d_m, Hkv·dk], wv [d_m, Hkv·dv], wo [H·dv, d_out];
 * biases 1-D. wq, wk, wv are required; the others NULL for none. */
typedef struct qkv_layer_weights {
  size_t struct_size;
  const qkv_tensor* wq;
  const qkv_tensor* wk;
  const qkv_tensor* wv;
  const qkv_tensor* wo;
  const qkv_tensor* bq;
  const qkv_tensor* bk;
  const qkv_tensor* bv;
  const qkv_tensor* bo;
} qkv_layer_weights;

typedef struct qkv_layer_options {
  size_t struct_size;
  int64_t heads;    /* H */
  int64_t kv_heads; /* 0: as many as heads */
  /* NULL: defaults. A pointer, not a member, so that both structs can grow. */
  const qkv_attention_options* attention;
} qkv_layer_options;

static inline void qkv_layer_weights_init(qkv_layer_weights* weights) {
  memset(weights, 0, sizeof *weights);
  weights->struct_size = sizeof *weights;
}
static inline void qkv_layer_options_init(qkv_layer_options* options) {
  memset(options, 0, sizeof *options);
  options->struct_size = sizeof *options;
  options->heads = 1;
}

/* x [B, N, d] or [N, d]; `memory` (NULL: self-attention) is cross-attention's source of K and V.
 * The result's out is [.., N, d_out] ([.., N, H·dv] without wo). options->attention's dropout
 * fields (version 3) drop the heads' weights: head h of batch b draws the mask qkv_attention
 * draws for (b, h) on the projected heads [B, H, N, dk] with the same seed and dropout_offset. */
qkv_status qkv_multi_head_attention(const qkv_tensor* x, const qkv_layer_weights* weights,
                                    const qkv_layer_options* options, const qkv_tensor* memory,
                                    qkv_result** result);

/* The gradients of sum(out ∘ grad_out) for out = qkv_multi_head_attention(x, weights, options,
 * memory): grad_out has out's shape. The chain rule through the output projection, each head's
 * attention backward (every option of the forward honoured; with dropout, the same options draw
 * the forward's mask again) and the input projections. The
 * forward runs again inside the call (the C API keeps no state between calls), so
 * options.attention->kernel, when set, names a kernel of both lists ("fused_hwy",
 * "unfused_blas", "fused_scalar", "reference"), for that forward and the backward. The result's parts are
 * QKV_RESULT_DX (x's shape), _DMEMORY (with a memory), _DWQ, _DWK, _DWV, and _DWO, _DBQ, _DBK,
 * _DBV, _DBO where that weight was given (each its weight's shape), _DSINKS ([H], with sinks);
 * float32, or float64 when the layer computes in float64; bitwise the same for any thread
 * count. */
qkv_status qkv_layer_backward(const qkv_tensor* x, const qkv_layer_weights* weights,
                              const qkv_layer_options* options, const qkv_tensor* memory,
                              const qkv_tensor* grad_out, qkv_result** result);

/* The KV cache (qkv::KVCache): pages of rows per sequence, forks share pages copy-on-write. */
typedef enum qkv_cache_storage {
  QKV_CACHE_F32 = 0,
  QKV_CACHE_BF16 = 1,
  QKV_CACHE_F16 = 2,
  QKV_CACHE_INT8 = 3 /* blocks of 32 values with one float scale */
} qkv_cache_storage;

typedef struct qkv_kv_cache_options {
  size_t struct_size;
  int64_t kv_heads; /* Hkv > 0 */
  int64_t d;        /* key head dimension */
  int64_t dv;       /* value head dimension */
  qkv_cache_storage storage;
  int64_t page_rows;   /* rows per page > 0 */
  int64_t max_pages;   /* 0: no bound */
  uint64_t max_bytes;  /* 0: no bound */
} qkv_kv_cache_options;

static inline void qkv_kv_cache_options_init(qkv_kv_cache_options* options) {
  memset(options, 0, sizeof *options);
  options->struct_size = sizeof *options;
  options->kv_heads = 1;
  options->storage = QKV_CACHE_F32;
  options->page_rows = 256;
}

typedef struct qkv_kv_cache qkv_kv_cache;

qkv_status qkv_kv_cache_create(const qkv_kv_cache_options* options, qkv_kv_cache** cache);
void qkv_kv_cache_destroy(qkv_kv_cache* cache); /* NULL is fine */
qkv_status qkv_kv_cache_add_sequence(qkv_kv_cache* cache, int64_t* sequence);
qkv_status qkv_kv_cache_fork(qkv_kv_cache* cache, int64_t parent, int64_t* sequence);
qkv_status qkv_kv_cache_remove(qkv_kv_cache* cache, int64_t sequence);
/* k [Hkv, n, D], v [Hkv, n, Dv] ([n, D], [n, Dv] when Hkv = 1). On failure (including a full
 * cache, QKV_ERROR_LIMIT) the cache is as it was. */
qkv_status qkv_kv_cache_append(qkv_kv_cache* cache, int64_t sequence, const qkv_tensor* k,
                               const qkv_tensor* v);
qkv_status qkv_kv_cache_forget_before(qkv_kv_cache* cache, int64_t sequence, int64_t row);
qkv_status qkv_kv_cache_length(const qkv_kv_cache* cache, int64_t sequence, int64_t* length);
qkv_status qkv_kv_cache_pages_in_use(const qkv_kv_cache* cache, int64_t* pages);

/* New queries against cached rows: q [S, H, Nq, D] ([H, Nq, D] when count = 1) for the
 * `count` sequences listed; query i of sequence s sits at position length(s) - Nq + i. Options:
 * scale, causal, window, return_lse, out_dtype, threads, kernel, max_memory (no mask, no
 * weights). A result handle, as the output is a new tensor per decoding step. */
qkv_status qkv_attention_cached(const qkv_kv_cache* cache, const qkv_tensor* q,
                                const int64_t* sequences, size_t count,
                                const qkv_attention_options* options, qkv_result** result);

/* Reads an .npy file (hostile-file proof, as the CLI) into a result whose QKV_RESULT_OUT part is
 * the array. A file that cannot be opened or parsed is QKV_ERROR_FILE, its subject the path. */
qkv_status qkv_read_npy(const char* path, qkv_result** result);

#ifdef __cplusplus
}
#endif

#endif /* QKV_QKV_C_H_ */
