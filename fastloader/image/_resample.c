/*
 * Antialiased two-pass resize, from the decoder's RGBX rows straight into a packed RGB batch slot.
 *
 * Why our own: after a small JPEG's decode, PIL's resize and the copy of its result into the batch took
 * a third of an image's time (a 168-px crop to 224 px: 100 us of resize and 20 of copy against 270 of
 * decode, Pillow-SIMD), and each needs a PIL image around the pixels. This one writes the slot
 * directly, flipped on the way, without the GIL.
 *
 * The arithmetic is PIL's (Pillow's Resample.c, 8 bits a channel), so that the crops and filters mean
 * what they mean to torchvision: for each output pixel the filter, stretched by the downscale factor
 * (antialiasing), is sampled at the input pixel centres its support reaches, clipped to the image, and
 * normalised to sum 1; one pass runs over the part of the image the other needs, rounding to 8 bits
 * between the passes. Which runs first is the PIL's choice, and PILs differ (fl_resample_set_order): the
 * horizontal always (Pillow-SIMD, Pillow before 13), or the vertical when the height shrinks by more than
 * twice as many pixels as the width (Pillow 13). The rounding and clipping between the passes make the
 * orders differ by tens of levels where the filter overshoots (bicubic, Lanczos). Weights are 16-bit
 * fixed point with as many fractional bits as Pillow-SIMD gives each axis: its pixels exactly. Pillow's
 * weights have 22 bits: its pixels within two levels (tested against the PIL installed, every filter).
 *
 * Speed: a pass along y is a weighted sum of whole rows, 32 bytes at a time with AVX2 (two rows' bytes
 * interleaved, times their two weights, in one multiply-add), plain C elsewhere; AVX2 is picked at run
 * time. A pass along x is not (each output pixel reads its own few input pixels), so it runs along y
 * too, on the region transposed (a row per column, 4 x 4 pixel blocks in registers), and the result is
 * transposed back. The weights of an axis depend on its sizes and box alone: a thread keeps the last
 * few it planned, so a batch of one image size (an eval transform's centre crop) plans each once. A
 * 168-px crop of a 256 x 192 image to 224 px: about 40 us, against 100 for Pillow-SIMD's resize and 20
 * for the copy into the slot (one thread of a 2-core AMD EPYC virtual machine, AVX2).
 */
#include "_resample.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#define HAVE_AVX2 1
#include <immintrin.h>
#else
#define HAVE_AVX2 0
#endif

/* Weights are fixed point in 16 bits, so that AVX2 multiplies pairs of them by pairs of pixels in one
 * instruction. The fractional bits are chosen per axis as Pillow-SIMD chooses them (so that its integers
 * are ours): the fewest at which the largest weight, with one bit more, would reach 2^15 (14 for weights
 * near 1, an upscale's; more for a downscale's smaller ones), at most Pillow's 22. A fixed 14 bits left a
 * downscale's many small weights coarse: one or two levels off Pillow-SIMD's pixels. */
#define MAX_WEIGHT_BITS 22

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

/* ---- the filters: PIL's, as functions of the distance in (stretched) input pixels ---- */

static double box_filter(double x) { return (x > -0.5 && x <= 0.5) ? 1.0 : 0.0; }

static double triangle_filter(double x) {
    x = fabs(x);
    return x < 1.0 ? 1.0 - x : 0.0;
}

static double sinc(double x) {
    if (x == 0.0) return 1.0;
    x *= M_PI;
    return sin(x) / x;
}

static double hamming_filter(double x) {
    x = fabs(x);
    if (x == 0.0) return 1.0;
    if (x >= 1.0) return 0.0;
    return sinc(x) * ((double)0.54f + (double)0.46f * cos(M_PI * x)); /* PIL's constants are floats */
}

static double cubic_filter(double x) { /* Keys' cubic with a = -0.5, PIL's BICUBIC */
    const double a = -0.5;
    x = fabs(x);
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
    return 0.0;
}

static double lanczos_filter(double x) { return (x >= -3.0 && x < 3.0) ? sinc(x) * sinc(x / 3.0) : 0.0; }

static const struct {
    double (*weight)(double);
    double support; /* radius in input pixels at scale 1 */
} FILTERS[FL_FILTERS] = {
    [FL_BOX] = {box_filter, 0.5},       [FL_BILINEAR] = {triangle_filter, 1.0}, [FL_HAMMING] = {hamming_filter, 1.0},
    [FL_BICUBIC] = {cubic_filter, 2.0}, [FL_LANCZOS] = {lanczos_filter, 3.0},
};

/* ---- the weights of one axis ---- */

/* Output pixel i is the sum over t < count[i] of input pixel first[i] + t times weights[i * taps + t],
 * shifted right by `bits` (the weights' fractional bits); pairs[i * pair_taps + t / 2] holds weights t and
 * t + 1 as two 16-bit halves (0 past count[i]), as the AVX2 pass multiplies them. */
typedef struct {
    int taps, pair_taps, bits;
    int *first, *count;
    int32_t *weights;
    uint32_t *pairs;
} Axis;

static void free_axis(Axis *axis) {
    free(axis->first);
    free(axis->count);
    free(axis->weights);
    free(axis->pairs);
    memset(axis, 0, sizeof *axis);
}

/* The weights an axis of `length` input pixels (the box's width or height) resized to out_size takes:
 * taps (the filter's reach, stretched by the downscale factor) per output pixel. SIZE_MAX past
 * FL_MAX_AXIS_WEIGHTS, for a length that is not finite and for bad arguments. */
size_t fl_axis_weights(double length, int out_size, int filter) {
    double scale, support;
    if (filter < 0 || filter >= FL_FILTERS || out_size <= 0 || !isfinite(length)) return SIZE_MAX;
    scale = length / out_size;
    support = FILTERS[filter].support * (scale < 1.0 ? 1.0 : scale);
    if (support > (double)FL_MAX_AXIS_WEIGHTS) return SIZE_MAX; /* before the products below can overflow */
    if (((size_t)ceil(support) * 2 + 1) * (size_t)out_size > FL_MAX_AXIS_WEIGHTS) return SIZE_MAX;
    return ((size_t)ceil(support) * 2 + 1) * (size_t)out_size;
}

/* The fractional bits of an axis whose largest weight is `largest` (see MAX_WEIGHT_BITS). */
static int weight_bits(double largest) {
    int bits = 0;
    while (bits < MAX_WEIGHT_BITS && 0.5 + largest * (double)(1 << (bits + 1)) < (double)(1 << 15)) bits++;
    return bits;
}

/* in0, in1: the box's edges as PIL holds them (float), in input pixels; in_size: where the input ends.
 * The weights are planned in doubles for the whole axis first: their fractional bits depend on the
 * largest. Weights that round to 0 at either end are dropped: they add nothing, and an upscale by a
 * triangle would otherwise read three pixels where two matter. */
static int plan_axis(Axis *axis, int in_size, float in0, float in1, int out_size, int filter) {
    size_t weights = fl_axis_weights((double)(in1 - in0), out_size, filter);
    double scale = (double)(in1 - in0) / out_size, stretch = scale < 1.0 ? 1.0 : scale;
    double support = FILTERS[filter].support * stretch, shrink = 1.0 / stretch, largest = 0.0, unit, *real;
    int i, t, taps;

    memset(axis, 0, sizeof *axis);
    if (weights > FL_MAX_AXIS_WEIGHTS) return -1;
    axis->taps = taps = (int)(weights / (size_t)out_size);
    axis->pair_taps = (taps + 1) / 2;
    axis->first = malloc((size_t)out_size * sizeof(int));
    axis->count = malloc((size_t)out_size * sizeof(int));
    axis->weights = malloc(weights * sizeof(int32_t));
    axis->pairs = malloc((size_t)out_size * (size_t)axis->pair_taps * sizeof(uint32_t));
    real = malloc(weights * sizeof(double));
    if (!axis->first || !axis->count || !axis->weights || !axis->pairs || !real) {
        free(real);
        free_axis(axis);
        return -1;
    }
    for (i = 0; i < out_size; i++) {
        double centre = in0 + (i + 0.5) * scale, sum = 0.0, *r = real + (size_t)i * taps;
        int lo = (int)(centre - support + 0.5), hi = (int)(centre + support + 0.5), n;
        if (lo < 0) lo = 0;
        if (hi > in_size) hi = in_size;
        n = hi > lo ? hi - lo : 0;
        for (t = 0; t < n; t++) {
            r[t] = FILTERS[filter].weight((t + lo - centre + 0.5) * shrink);
            sum += r[t];
        }
        for (t = 0; t < n; t++) {
            if (sum != 0.0) r[t] /= sum;
            if (r[t] > largest) largest = r[t];
        }
        axis->first[i] = lo;
        axis->count[i] = n;
    }
    axis->bits = weight_bits(largest);
    unit = (double)(1 << axis->bits);
    for (i = 0; i < out_size; i++) {
        const double *r = real + (size_t)i * taps;
        int32_t *w = axis->weights + (size_t)i * taps;
        int n = axis->count[i], skip = 0;
        for (t = 0; t < n; t++) {
            double v = r[t] * unit;
            v = v < 0 ? v - 0.5 : v + 0.5;
            /* 16 bits, as the AVX2 pass multiplies them: a weight leaves that range only for a box reaching
             * far past the input's edge (a normalising sum near 0), where no pixel is meaningful anyway. */
            w[t] = v <= INT16_MIN ? INT16_MIN : v >= INT16_MAX ? INT16_MAX : (int32_t)v;
        }
        while (n > 0 && w[n - 1] == 0) n--;
        while (skip < n && w[skip] == 0) skip++;
        memmove(w, w + skip, (size_t)(n - skip) * sizeof(int32_t));
        axis->first[i] += skip;
        axis->count[i] = n -= skip;
        for (t = 0; t < axis->pair_taps; t++) {
            uint32_t even = 2 * t < n ? (uint32_t)w[2 * t] & 0xFFFFu : 0, odd = 2 * t + 1 < n ? (uint32_t)w[2 * t + 1] : 0;
            axis->pairs[(size_t)i * axis->pair_taps + t] = odd << 16 | even;
        }
    }
    free(real);
    return 0;
}

/* ---- scratch memory and plans, kept per thread ---- */

/* Fresh memory for every image would be new pages every image (glibc maps blocks this large anew and
 * gives them back on free): each thread keeps its buffers, grown as needed, freed when it ends. A
 * buffer grown past KEEP_BYTES for one huge image is let go after it (fl_thread_buffers_trim).
 *
 * It also keeps the axes it planned last: the images of a batch often share their size and box (an
 * eval transform's centre crop), and planning an axis costs about a tenth of a small image's resize. */
#define KEEP_BYTES ((size_t)16 << 20)
#define KEEP_AXIS_WEIGHTS ((size_t)1 << 14) /* an axis of more taps x outputs is not kept (100 KB) */
#define CACHED_AXES 8                          /* a batch of landscape and portrait images: 4 axes */
static pthread_key_t buffer_key;
static pthread_once_t buffer_once = PTHREAD_ONCE_INIT;
static int buffer_key_ok;

typedef struct {
    int in_size, out_size, filter;
    float in0, in1;
    unsigned long used; /* when it was last returned, by the thread's count of returns */
    Axis axis;          /* taps == 0: an empty entry */
} CachedAxis;

typedef struct {
    void *data[FL_BUFFERS];
    size_t size[FL_BUFFERS];
    CachedAxis axes[CACHED_AXES];
    unsigned long axes_returned;
} Buffers;

static void free_buffers(void *pointer) {
    Buffers *buffers = pointer;
    int i;
    for (i = 0; i < FL_BUFFERS; i++) free(buffers->data[i]);
    for (i = 0; i < CACHED_AXES; i++) free_axis(&buffers->axes[i].axis);
    free(buffers);
}

static void make_buffer_key(void) { buffer_key_ok = pthread_key_create(&buffer_key, free_buffers) == 0; }

static Buffers *thread_buffers(void) {
    Buffers *buffers;
    if (pthread_once(&buffer_once, make_buffer_key) != 0 || !buffer_key_ok) return NULL;
    buffers = pthread_getspecific(buffer_key);
    if (buffers == NULL) {
        buffers = calloc(1, sizeof *buffers);
        if (buffers == NULL || pthread_setspecific(buffer_key, buffers) != 0) {
            free(buffers);
            return NULL;
        }
    }
    return buffers;
}

void *fl_thread_buffer(int which, size_t bytes) {
    Buffers *buffers;
    if (which < 0 || which >= FL_BUFFERS || (buffers = thread_buffers()) == NULL) return NULL;
    if (buffers->size[which] < bytes) {
        free(buffers->data[which]);
        buffers->data[which] = malloc(bytes);
        buffers->size[which] = buffers->data[which] != NULL ? bytes : 0;
    }
    return buffers->data[which];
}

void fl_thread_buffers_trim(void) {
    Buffers *buffers;
    int i;
    if (!buffer_key_ok || (buffers = pthread_getspecific(buffer_key)) == NULL) return;
    for (i = 0; i < FL_BUFFERS; i++)
        if (buffers->size[i] > KEEP_BYTES) {
            free(buffers->data[i]);
            buffers->data[i] = NULL;
            buffers->size[i] = 0;
        }
}

/* The plan of an axis (plan_axis's arguments): this thread's kept one, or planned now and kept in place
 * of the least recently returned (a large one, or when the thread keeps nothing, into `scratch`, which
 * the caller frees). The last CACHED_AXES axes returned stay valid. NULL when memory ran out. */
static const Axis *planned_axis(Axis *scratch, int in_size, float in0, float in1, int out_size, int filter) {
    Buffers *buffers = thread_buffers();
    CachedAxis *entry, *oldest;
    int i;
    if (buffers == NULL) return plan_axis(scratch, in_size, in0, in1, out_size, filter) ? NULL : scratch;
    oldest = &buffers->axes[0];
    for (i = 0; i < CACHED_AXES; i++) {
        entry = &buffers->axes[i];
        if (entry->axis.taps && entry->in_size == in_size && entry->out_size == out_size && entry->filter == filter &&
            entry->in0 == in0 && entry->in1 == in1) {
            entry->used = ++buffers->axes_returned;
            return &entry->axis;
        }
        if (entry->used < oldest->used) oldest = entry;
    }
    if (plan_axis(scratch, in_size, in0, in1, out_size, filter)) return NULL;
    if ((size_t)scratch->taps * (size_t)out_size > KEEP_AXIS_WEIGHTS) return scratch;
    free_axis(&oldest->axis);
    *oldest = (CachedAxis){in_size, out_size, filter, in0, in1, ++buffers->axes_returned, *scratch};
    memset(scratch, 0, sizeof *scratch); /* the entry owns its arrays now */
    return &oldest->axis;
}

/* ---- the passes ---- */

/* Half of the last unit the shift drops: the sums round to nearest. */
static inline int32_t half_unit(int bits) { return bits > 0 ? (int32_t)1 << (bits - 1) : 0; }

static inline uint8_t clip8(int32_t sum, int bits) {
    int32_t v = sum >> bits;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* Byte j of an output row: the bytes j of its n input rows (from `first`, in_stride apart) by the weights. */
static inline uint8_t weigh_byte(const uint8_t *first, size_t in_stride, size_t j, const int32_t *w, int n,
                                 int bits) {
    int32_t sum = half_unit(bits);
    int t;
    for (t = 0; t < n; t++) sum += first[(size_t)t * in_stride + j] * w[t];
    return clip8(sum, bits);
}

/* Rows of `bytes` bytes, weighted along the rows by `axis`: output row i, at out + i * out_stride, from the
 * input rows axis->first[i] - row0 + t of `in` (rows in_stride bytes apart). */
static void weigh_rows_baseline(const uint8_t *in, size_t in_stride, int row0, size_t bytes, const Axis *axis,
                                int out_rows, uint8_t *out, ptrdiff_t out_stride) {
    int i;
    size_t j;
    for (i = 0; i < out_rows; i++) {
        const int32_t *w = axis->weights + (size_t)i * axis->taps;
        const uint8_t *first = in + (size_t)(axis->first[i] - row0) * in_stride;
        uint8_t *row = out + (ptrdiff_t)i * out_stride;
        for (j = 0; j < bytes; j++) row[j] = weigh_byte(first, in_stride, j, w, axis->count[i], axis->bits);
    }
}

#if HAVE_AVX2
/* 32 bytes of an output row, from its n input rows at `first` (in_stride bytes apart): bytes of two input
 * rows interleaved and widened to 16 bits, times their two weights, summed in pairs into 32-bit lanes
 * (vpmaddwd); the exact same integers as weigh_byte. The unpacks and packs work within 128-bit halves,
 * and the packs undo the unpacks' order. Four named sums, not an array: gcc keeps them in registers. */
__attribute__((target("avx2"))) static inline __m256i weigh_chunk(const uint8_t *first, size_t in_stride,
                                                                 const uint32_t *pairs, int n, int bits) {
    const __m256i zero = _mm256_setzero_si256(), half = _mm256_set1_epi32(half_unit(bits));
    const __m128i shift = _mm_cvtsi32_si128(bits);
    __m256i s0 = half, s1 = half, s2 = half, s3 = half;
    int t;
    for (t = 0; t < n; t += 2) {
        const uint8_t *src = first + (size_t)t * in_stride;
        __m256i a = _mm256_loadu_si256((const __m256i *)src);
        __m256i b = t + 1 < n ? _mm256_loadu_si256((const __m256i *)(src + in_stride)) : zero;
        __m256i pair = _mm256_set1_epi32((int32_t)pairs[t / 2]);
        __m256i low = _mm256_unpacklo_epi8(a, b), high = _mm256_unpackhi_epi8(a, b);
        s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_unpacklo_epi8(low, zero), pair));
        s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_unpackhi_epi8(low, zero), pair));
        s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(_mm256_unpacklo_epi8(high, zero), pair));
        s3 = _mm256_add_epi32(s3, _mm256_madd_epi16(_mm256_unpackhi_epi8(high, zero), pair));
    }
    s0 = _mm256_sra_epi32(s0, shift);
    s1 = _mm256_sra_epi32(s1, shift);
    s2 = _mm256_sra_epi32(s2, shift);
    s3 = _mm256_sra_epi32(s3, shift);
    return _mm256_packus_epi16(_mm256_packs_epi32(s0, s1), _mm256_packs_epi32(s2, s3));
}

/* weigh_rows_baseline, 32 bytes at a time. A row's last bytes are its last 32 again, overlapping the
 * chunk before: a byte depends on its own column only, and in and out never overlap. */
__attribute__((target("avx2"))) static void weigh_rows_avx2(const uint8_t *in, size_t in_stride, int row0,
                                                           size_t bytes, const Axis *axis, int out_rows, uint8_t *out,
                                                           ptrdiff_t out_stride) {
    int i;
    size_t j;
    for (i = 0; i < out_rows; i++) {
        const uint8_t *first = in + (size_t)(axis->first[i] - row0) * in_stride;
        const uint32_t *pairs = axis->pairs + (size_t)i * axis->pair_taps;
        uint8_t *row = out + (ptrdiff_t)i * out_stride;
        int n = axis->count[i], bits = axis->bits;
        if (bytes < 32) {
            for (j = 0; j < bytes; j++)
                row[j] = weigh_byte(first, in_stride, j, axis->weights + (size_t)i * axis->taps, n, bits);
            continue;
        }
        for (j = 0; j + 32 <= bytes; j += 32)
            _mm256_storeu_si256((__m256i *)(row + j), weigh_chunk(first + j, in_stride, pairs, n, bits));
        if (j < bytes)
            _mm256_storeu_si256((__m256i *)(row + bytes - 32),
                                weigh_chunk(first + bytes - 32, in_stride, pairs, n, bits));
    }
}
#endif

/* Asked once: the CPUID instruction behind it costs tens of microseconds in some virtual machines.
 * FASTLOADER_NO_SIMD_RESIZE=1 in the environment keeps to the plain C passes (the tests compare the two;
 * the same integers either way). */
static int simd = -1; /* atomic: threads without a GIL may ask at once (they compute the same answer) */

int fl_resample_simd(void) {
#if HAVE_AVX2
    int known = __atomic_load_n(&simd, __ATOMIC_RELAXED);
    if (known < 0) {
        const char *off = getenv("FASTLOADER_NO_SIMD_RESIZE");
        __builtin_cpu_init();
        known = (off == NULL || strcmp(off, "1") != 0) && __builtin_cpu_supports("avx2") ? 1 : 0;
        __atomic_store_n(&simd, known, __ATOMIC_RELAXED);
    }
    return known;
#else
    return 0;
#endif
}

static void weigh(const uint8_t *in, size_t in_stride, int row0, size_t bytes, const Axis *axis, int out_rows,
                  uint8_t *out, ptrdiff_t out_stride) {
#if HAVE_AVX2
    if (fl_resample_simd()) {
        weigh_rows_avx2(in, in_stride, row0, bytes, axis, out_rows, out, out_stride);
        return;
    }
#endif
    weigh_rows_baseline(in, in_stride, row0, bytes, axis, out_rows, out, out_stride);
}

/* The input pixels [*start, *start + *length) that some weight of the axis reads (at least one pixel). */
static void reach(const Axis *axis, int out_size, int *start, int *length) {
    int i, lo = INT_MAX, hi = 0;
    for (i = 0; i < out_size; i++) {
        if (axis->count[i] == 0) continue;
        if (axis->first[i] < lo) lo = axis->first[i];
        if (axis->first[i] + axis->count[i] > hi) hi = axis->first[i] + axis->count[i];
    }
    if (lo == INT_MAX) lo = hi = 0;
    *start = lo;
    *length = hi > lo ? hi - lo : 1;
}

/* The transposes. Buffers of packed RGB rows are padded by PAD bytes a row, so that a pixel can be
 * copied as 4 bytes and 4 pixels as 16: what lands past a pixel is overwritten later or lies in the pad. */
#define PAD 4

/* cols x rows RGBX pixels (rows `stride` bytes apart) to cols rows (`out_stride` apart) of rows packed
 * RGB pixels; the scalar version goes by bands of TILE columns, so that it reads and writes TILE streams
 * at a time (whole columns at once would read a cache line per row, evicting each other when rows are
 * 2^k bytes apart). */
#define TILE 16

static void transpose_in_baseline(const uint8_t *src, ptrdiff_t stride, int cols, int rows, uint8_t *columns,
                                  size_t out_stride) {
    int x0, x, y;
    for (x0 = 0; x0 < cols; x0 += TILE) {
        int x1 = x0 + TILE < cols ? x0 + TILE : cols;
        for (y = 0; y < rows; y++) {
            const uint8_t *in = src + (ptrdiff_t)y * stride;
            for (x = x0; x < x1; x++) memcpy(columns + (size_t)x * out_stride + (size_t)y * 3, in + (size_t)x * 4, 4);
        }
    }
}

/* `cols` rows (`in_stride` apart) of `rows` packed RGB pixels back to rows x cols (rows out_stride apart),
 * mirrored when flip. Output pixels are written left to right either way. */
static void transpose_out_baseline(const uint8_t *columns, size_t in_stride, int cols, int rows, int flip,
                                   uint8_t *dst, size_t out_stride) {
    int x0, x, y;
    for (x0 = 0; x0 < cols; x0 += TILE) {
        int x1 = x0 + TILE < cols ? x0 + TILE : cols;
        for (y = 0; y < rows; y++) {
            uint8_t *row = dst + (size_t)y * out_stride;
            const uint8_t *at = columns + (size_t)y * 3;
            for (x = x0; x < x1; x++) memcpy(row + (size_t)x * 3, at + (size_t)(flip ? cols - 1 - x : x) * in_stride, 4);
        }
    }
}

#if HAVE_AVX2
/* 4 x 4 blocks of 4-byte pixels, transposed in registers; RGBX to packed RGB and back by byte shuffles.
 * The edges that make no whole block go to the plain transposes. */
__attribute__((target("avx2"))) static inline void transpose4(__m128i *v) {
    __m128i t0 = _mm_unpacklo_epi32(v[0], v[1]), t1 = _mm_unpackhi_epi32(v[0], v[1]);
    __m128i t2 = _mm_unpacklo_epi32(v[2], v[3]), t3 = _mm_unpackhi_epi32(v[2], v[3]);
    v[0] = _mm_unpacklo_epi64(t0, t2);
    v[1] = _mm_unpackhi_epi64(t0, t2);
    v[2] = _mm_unpacklo_epi64(t1, t3);
    v[3] = _mm_unpackhi_epi64(t1, t3);
}

__attribute__((target("avx2"))) static void transpose_in_avx2(const uint8_t *src, ptrdiff_t stride, int cols, int rows,
                                                             uint8_t *columns, size_t out_stride) {
    const __m128i pack = _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
    int x, y, k;
    for (y = 0; y + 4 <= rows; y += 4) {
        const uint8_t *in = src + (ptrdiff_t)y * stride;
        uint8_t *out = columns + (size_t)y * 3;
        for (x = 0; x + 4 <= cols; x += 4) {
            __m128i v[4];
            for (k = 0; k < 4; k++) v[k] = _mm_loadu_si128((const __m128i *)(in + k * stride + (size_t)x * 4));
            transpose4(v); /* v[k]: column x + k, rows y .. y + 3 */
            for (k = 0; k < 4; k++)
                _mm_storeu_si128((__m128i *)(out + (size_t)(x + k) * out_stride), _mm_shuffle_epi8(v[k], pack));
        }
        transpose_in_baseline(in + (size_t)x * 4, stride, cols - x, 4, out + (size_t)x * out_stride, out_stride);
    }
    transpose_in_baseline(src + (ptrdiff_t)y * stride, stride, cols, rows - y, columns + (size_t)y * 3, out_stride);
}

__attribute__((target("avx2"))) static void transpose_out_avx2(const uint8_t *columns, size_t in_stride, int cols,
                                                              int rows, int flip, uint8_t *dst, size_t out_stride) {
    const __m128i pack = _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
    const __m128i unpack = _mm_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1);
    int x, y, k;
    for (y = 0; y + 4 <= rows; y += 4) {
        const uint8_t *in = columns + (size_t)y * 3;
        uint8_t *out = dst + (size_t)y * out_stride;
        for (x = 0; x + 4 <= cols; x += 4) {
            __m128i v[4];
            for (k = 0; k < 4; k++) {
                int column = flip ? cols - 1 - (x + k) : x + k;
                v[k] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(in + (size_t)column * in_stride)), unpack);
            }
            transpose4(v); /* v[k]: row y + k, output pixels x .. x + 3 */
            for (k = 0; k < 4; k++)
                _mm_storeu_si128((__m128i *)(out + (size_t)k * out_stride + (size_t)x * 3), _mm_shuffle_epi8(v[k], pack));
        }
        /* Output pixels x.. come from columns x.. (flipped: the first cols - x, mirrored). */
        transpose_out_baseline(flip ? in : in + (size_t)x * in_stride, in_stride, cols - x, 4, flip,
                               out + (size_t)x * 3, out_stride);
    }
    transpose_out_baseline(columns + (size_t)y * 3, in_stride, cols, rows - y, flip, dst + (size_t)y * out_stride,
                           out_stride);
}
#endif

static void transpose_in(const uint8_t *src, ptrdiff_t stride, int cols, int rows, uint8_t *columns,
                         size_t out_stride) {
#if HAVE_AVX2
    if (fl_resample_simd()) {
        transpose_in_avx2(src, stride, cols, rows, columns, out_stride);
        return;
    }
#endif
    transpose_in_baseline(src, stride, cols, rows, columns, out_stride);
}

static void transpose_out(const uint8_t *columns, size_t in_stride, int cols, int rows, int flip, uint8_t *dst,
                          size_t out_stride) {
#if HAVE_AVX2
    if (fl_resample_simd()) {
        transpose_out_avx2(columns, in_stride, cols, rows, flip, dst, out_stride);
        return;
    }
#endif
    transpose_out_baseline(columns, in_stride, cols, rows, flip, dst, out_stride);
}

/* ---- the two pass orders ---- */

/* Which pass runs first where both change the image: the order of the PIL the process matches, set once
 * from Python (fl_resample_set_order) before the threads that read it resize. */
static int pass_order = FL_ORDER_HORIZONTAL_FIRST;

void fl_resample_set_order(int order) {
    __atomic_store_n(&pass_order, order == FL_ORDER_PILLOW_13 ? order : FL_ORDER_HORIZONTAL_FIRST, __ATOMIC_RELAXED);
}

int fl_resample_order(void) { return __atomic_load_n(&pass_order, __ATOMIC_RELAXED); }

/* Pillow 13's choice (Pillow-SIMD and older Pillows run the horizontal pass first, always): the vertical pass
 * first when the height loses pixels, more than twice as many as the width loses (the image's sizes, not
 * the box's). Where one pass leaves the image as it is, either order gives the same pixels. */
static int vertical_first(int src_w, int src_h, int out_w, int out_h) {
    long long lost_h = (long long)src_h - out_h, lost_w = (long long)src_w - out_w;
    return fl_resample_order() == FL_ORDER_PILLOW_13 && lost_h > 0 && lost_h > 2 * lost_w;
}

/* The input pixels the weights reach: `cols` RGBX pixels of `rows` rows from `pixels` (rows `stride` bytes
 * apart), the rows from row0 and the columns from col0 of the axes' numbering. */
typedef struct {
    const uint8_t *pixels;
    ptrdiff_t stride;
    int row0, rows, col0, cols;
} Region;

/* Horizontal first: the region transposed (a row of packed RGB per column), the pass along x on it (still
 * transposed), that transposed back into rows (mirrored on the way), and the pass along y into dst. The
 * transposes read 16 bytes where 12 matter: the buffers end with 16 bytes of slack. */
static int resample_horizontal_first(const Region *in, const Axis *ax, const Axis *ay, uint8_t *dst,
                                     ptrdiff_t dst_stride, int out_w, int out_h, int flip) {
    size_t column_bytes = (size_t)in->rows * 3, column_stride = column_bytes + PAD;
    size_t row_bytes = (size_t)out_w * 3, row_stride = row_bytes + PAD;
    size_t columns_size = (size_t)in->cols * column_stride + 16, across_size = (size_t)out_w * column_stride + 16;
    uint8_t *columns, *across, *rows_rgb;

    columns = fl_thread_buffer(FL_BUFFER_RESAMPLE, columns_size + across_size + (size_t)in->rows * row_stride + 16);
    if (columns == NULL) return -1;
    across = columns + columns_size;
    rows_rgb = across + across_size;
    transpose_in(in->pixels, in->stride, in->cols, in->rows, columns, column_stride);
    weigh(columns, column_stride, in->col0, column_bytes, ax, out_w, across, (ptrdiff_t)column_stride);
    transpose_out(across, column_stride, out_w, in->rows, flip, rows_rgb, row_stride);
    weigh(rows_rgb, row_stride, in->row0, row_bytes, ay, out_h, dst, dst_stride);
    return 0;
}

/* Vertical first: the pass along y on the region's RGBX rows as they are (the fourth bytes weighed too, and
 * never read again), that transposed, the pass along x on it, and the result transposed back into rows,
 * copied into dst (the transpose writes a little past each row's last pixel: not into the caller's). */
static int resample_vertical_first(const Region *in, const Axis *ax, const Axis *ay, uint8_t *dst,
                                   ptrdiff_t dst_stride, int out_w, int out_h, int flip) {
    size_t wide_bytes = (size_t)in->cols * 4, column_bytes = (size_t)out_h * 3, column_stride = column_bytes + PAD;
    size_t row_bytes = (size_t)out_w * 3, row_stride = row_bytes + PAD, tall_size = (size_t)out_h * wide_bytes + 16;
    size_t columns_size = (size_t)in->cols * column_stride + 16, across_size = (size_t)out_w * column_stride + 16;
    uint8_t *tall, *columns, *across, *rows_rgb;
    int y;

    tall = fl_thread_buffer(FL_BUFFER_RESAMPLE,
                            tall_size + columns_size + across_size + (size_t)out_h * row_stride + 16);
    if (tall == NULL) return -1;
    columns = tall + tall_size;
    across = columns + columns_size;
    rows_rgb = across + across_size;
    weigh(in->pixels, (size_t)in->stride, in->row0, wide_bytes, ay, out_h, tall, (ptrdiff_t)wide_bytes);
    transpose_in(tall, (ptrdiff_t)wide_bytes, in->cols, out_h, columns, column_stride);
    weigh(columns, column_stride, in->col0, column_bytes, ax, out_w, across, (ptrdiff_t)column_stride);
    transpose_out(across, column_stride, out_w, out_h, flip, rows_rgb, row_stride);
    for (y = 0; y < out_h; y++) memcpy(dst + (ptrdiff_t)y * dst_stride, rows_rgb + (size_t)y * row_stride, row_bytes);
    return 0;
}

int fl_resample(const uint8_t *src, ptrdiff_t src_stride, int src_w, int src_h, const float box[4], uint8_t *dst,
                ptrdiff_t dst_stride, int out_w, int out_h, int filter, int flip) {
    Axis own_x = {0}, own_y = {0};
    const Axis *ax, *ay;
    Region in;
    int status = -1;

    if (filter < 0 || filter >= FL_FILTERS || src_w <= 0 || src_h <= 0) return -1;
    ax = planned_axis(&own_x, src_w, box[0], box[2], out_w, filter);
    ay = ax != NULL ? planned_axis(&own_y, src_h, box[1], box[3], out_h, filter) : NULL;
    if (ay == NULL) goto done;
    reach(ay, out_h, &in.row0, &in.rows);
    reach(ax, out_w, &in.col0, &in.cols);
    in.pixels = src + (ptrdiff_t)in.row0 * src_stride + (ptrdiff_t)in.col0 * 4;
    in.stride = src_stride;
    status = vertical_first(src_w, src_h, out_w, out_h)
                 ? resample_vertical_first(&in, ax, ay, dst, dst_stride, out_w, out_h, flip)
                 : resample_horizontal_first(&in, ax, ay, dst, dst_stride, out_w, out_h, flip);
done:
    free_axis(&own_x);
    free_axis(&own_y);
    return status;
}
