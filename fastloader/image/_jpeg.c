/*
 * fastloader.image._jpeg: partial JPEG decoding with libjpeg-turbo, for RandomResizedCrop-style pipelines.
 *
 * A training crop covers about half of a photo, so decoding only the crop region saves most of the
 * decode: jpeg_crop_scanline() limits IDCT, upsampling and colour conversion to the iMCU columns of
 * the crop, jpeg_skip_scanlines() skips that work for rows above it (they are still entropy-decoded:
 * Huffman data cannot be skipped), and the rows below it are skipped the same way: entropy-decoded only, so
 * that a file cut short is refused whatever the crop. DCT scaling (scale_denom 2/4/8) composes with all three.
 *
 * Bad data: libjpeg's warnings that mean lost pixels (premature end, a marker inside the data, bad codes)
 * are errors here (on_message()), as is arithmetic-coded data that ends rows early (check_arith_end()),
 * a file of more than MAX_SCANS scans (counted before decoding) and one of more than MAX_PIXELS pixels.
 * Callers treat every such refusal as a bad file: none goes on to a more lenient decoder.
 *
 * Exactness: every pixel returned equals the same pixel of a full decode at the same scale (what PIL
 * produces with the same libjpeg). The one place cropping changes pixels is fancy (triangle) chroma
 * upsampling, which blends each chroma sample with its neighbours: libjpeg treats the crop's first and
 * last columns as image edges. So when a component is upsampled horizontally with fancy upsampling, we
 * decode one pixel further on each side and drop the edge columns (see plan_columns()).
 *
 * The Python wrapper (fastloader/image/jpeg_ext.py) turns the returned bytearray into a numpy array; this
 * file deliberately uses only the plain C API.
 *
 * Threading: the GIL is released while libjpeg runs. Each call creates, uses and destroys its own
 * decompressor on one thread (libjpeg-turbo 2.1.5 keeps SIMD detection per thread, so a decompressor
 * must never be started on one thread and read on another).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h> /* jpeglib.h needs FILE and size_t first */
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>

#include "_resample.h"

#if !defined(LIBJPEG_TURBO_VERSION_NUMBER) || LIBJPEG_TURBO_VERSION_NUMBER < 2001000
/* jpeg_crop_scanline() and jpeg_skip_scanlines() are libjpeg-turbo extensions, and before 2.0.7 / 2.1
 * they crashed or wrote whole uncropped rows with merged upsampling (its ChangeLog: 2.0.6 #2, 2.0.7 #9).
 * Failing the build here makes the optional extension absent, and fastloader falls back to PIL. */
#error "fastloader.image._jpeg needs libjpeg-turbo >= 2.1 headers"
#endif

#if JPEG_LIB_VERSION >= 70
#define COMP_H_SCALED(c) ((c)->DCT_h_scaled_size)
#define MIN_H_SCALED(ci) ((ci)->min_DCT_h_scaled_size)
#define MIN_V_SCALED(ci) ((ci)->min_DCT_v_scaled_size)
#else
#define COMP_H_SCALED(c) ((c)->DCT_scaled_size)
#define MIN_H_SCALED(ci) ((ci)->min_DCT_scaled_size)
#define MIN_V_SCALED(ci) ((ci)->min_DCT_scaled_size)
#endif

/* Decompression bombs: a few hundred bytes can declare 65500x65500 pixels. Checked on the header, before
 * libjpeg allocates anything image-sized (a progressive image's coefficient buffer is 2-6 bytes/pixel). */
#define MAX_PIXELS ((uint64_t)1 << 28)
/* A progressive file can hold thousands of tiny scans, each a full pass over the coefficient buffer (the
 * "Two Issues with the JPEG Standard" DoS). TurboJPEG's scan limit uses the same default. The scans are
 * counted from the file's markers before any is decoded (count_scans()), so a refusal costs no decode. */
#define MAX_SCANS 500

enum { FAIL_CORRUPT = 1, FAIL_UNSUPPORTED, FAIL_ARGUMENT };

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    int kind;
    char message[JMSG_LENGTH_MAX + 64];
} ErrorManager;

typedef struct {
    struct jpeg_decompress_struct cinfo;
    ErrorManager err;
    struct jpeg_progress_mgr progress;
    int created;
    /* Request, in full-resolution pixels. full_box: decode the whole image. */
    Py_ssize_t x0, y0, x1, y1;
    int full_box, scale, fast;
    int bpp; /* bytes per output pixel: 3 (RGB) or 4 (RGBX, which PIL maps without a copy) */
    int watch_end; /* a single arithmetic-coded scan: where its data ends is checked (check_arith_end()) */
    /* Plan, in scaled pixels: rows [row0, row1) of the scaled image; returned columns [ox, ox + out_w);
     * the decoder delivers rows of dec_w pixels of which `drop` leading ones are not returned. */
    JDIMENSION row0, row1, ox, out_w, dec_w, drop;
    size_t full_row_bytes;
} Job;

/* ---- error handling: libjpeg reports through callbacks; errors longjmp back to the phase's setjmp ---- */

static int unsupported_code(int code) {
    switch (code) {
    case JERR_BAD_PRECISION:   /* 12-bit */
    case JERR_SOF_UNSUPPORTED: /* lossless / hierarchical */
    case JERR_ARITH_NOTIMPL:
    case JERR_NOT_COMPILED:
    case JERR_CONVERSION_NOTIMPL:
    case JERR_NOTIMPL:
        return 1;
    default:
        return 0;
    }
}

static void on_error(j_common_ptr cinfo) {
    ErrorManager *err = (ErrorManager *)cinfo->err;
    char text[JMSG_LENGTH_MAX];
    (*cinfo->err->format_message)(cinfo, text);
    err->kind = unsupported_code(cinfo->err->msg_code) ? FAIL_UNSUPPORTED : FAIL_CORRUPT;
    snprintf(err->message, sizeof err->message, "JPEG decode failed: %s", text);
    longjmp(err->jump, 1);
}

static void fail(Job *job, int kind, const char *message) {
    job->err.kind = kind;
    snprintf(job->err.message, sizeof job->err.message, "%s", message);
    longjmp(job->err.jump, 1);
}

/* Warnings that mean pixels were lost: libjpeg substitutes grey (or garbage) and carries on. A truncated
 * file must not silently yield grey rows, so these are errors. Benign warnings (extraneous bytes before a
 * marker, unknown JFIF revision, odd Adobe transform codes) are ignored, as PIL ignores them. */
static void on_message(j_common_ptr cinfo, int level) {
    if (level >= 0) return; /* trace messages */
    switch (cinfo->err->msg_code) {
    case JWRN_JPEG_EOF:
    case JWRN_HIT_MARKER:
    case JWRN_MUST_RESYNC:
    case JWRN_HUFF_BAD_CODE:
    case JWRN_ARITH_BAD_CODE:
        on_error(cinfo);
        break;
    default:
        cinfo->err->num_warnings++;
    }
}

static void on_progress(j_common_ptr cinfo) {
    j_decompress_ptr dinfo = (j_decompress_ptr)cinfo;
    if (dinfo->input_scan_number > MAX_SCANS) {
        Job *job = (Job *)cinfo->client_data;
        char message[96];
        snprintf(message, sizeof message, "JPEG decode failed: more than %d scans (progressive DoS)", MAX_SCANS);
        fail(job, FAIL_CORRUPT, message);
    }
}

/* The scans of a multi-scan file, counted from its markers (a pass over the bytes, no decoding), from `p`: the
 * entropy-coded data of the first scan, where jpeg_read_header() stops. Stops counting past `limit`. In
 * entropy-coded data 0xFF is followed by a stuffed 0x00 or a restart marker; any other marker ends it, and
 * marker segments are skipped by their length (a table's bytes are never read as markers). */
static int count_scans(const unsigned char *p, const unsigned char *end, int limit) {
    int scans = 1;
    while (p < end && scans <= limit) {
        unsigned int marker;
        p = memchr(p, 0xFF, (size_t)(end - p));
        if (p == NULL) break;
        while (p + 1 < end && p[1] == 0xFF) p++; /* fill bytes */
        if (p + 1 >= end) break;
        marker = p[1];
        p += 2;
        if (marker == 0x00 || (marker >= 0xD0 && marker <= 0xD7) || marker == 0x01 || marker == 0xD8) continue;
        if (marker == 0xD9 || p + 2 > end) break; /* EOI */
        if (marker == 0xDA) scans++;
        p += ((size_t)p[0] << 8) | p[1]; /* the segment, its length bytes included; SOS: its header */
    }
    return scans;
}

/* Must run inside a phase (the error manager's jmp_buf is armed there). */
static void open_header(Job *job, const unsigned char *data, size_t size) {
    j_decompress_ptr cinfo = &job->cinfo;
    jpeg_create_decompress(cinfo);
    job->created = 1;
    cinfo->client_data = job;
    job->progress.progress_monitor = on_progress;
    cinfo->progress = &job->progress;
    if (size == 0) fail(job, FAIL_CORRUPT, "JPEG decode failed: empty input (0 bytes)");
    if (size < 2 || data[0] != 0xFF || data[1] != 0xD8) {
        /* libjpeg would say "Premature end" for a 1-byte input; name the problem instead. */
        char message[96];
        snprintf(message, sizeof message, "not a JPEG file: no SOI marker (starts with 0x%02x%s)", data[0],
                 size < 2 ? ", 1 byte long" : "");
        if (size >= 2)
            snprintf(message, sizeof message, "not a JPEG file: no SOI marker (starts with 0x%02x 0x%02x)", data[0],
                     data[1]);
        fail(job, FAIL_CORRUPT, message);
    }
    jpeg_mem_src(cinfo, data, (unsigned long)size);
    if (jpeg_read_header(cinfo, TRUE) != JPEG_HEADER_OK)
        fail(job, FAIL_CORRUPT, "JPEG decode failed: no image in the data (tables only)");
}

static void init_job(Job *job) {
    memset(job, 0, sizeof *job);
    job->bpp = 3;
    job->cinfo.err = jpeg_std_error(&job->err.pub);
    job->err.pub.error_exit = on_error;
    job->err.pub.emit_message = on_message;
}

static void close_job(Job *job) {
    if (job->created) jpeg_destroy_decompress(&job->cinfo); /* frees every libjpeg allocation */
    job->created = 0;
}

/* Corrupt data gets its own exception (a ValueError), so that callers fall back to PIL for bad data
   only, never for a ValueError that a bug (a bad argument) raises. */
static PyObject *CorruptJPEG = NULL;

static PyObject *raise_job_error(Job *job) {
    PyObject *type = job->err.kind == FAIL_UNSUPPORTED ? PyExc_NotImplementedError
                     : job->err.kind == FAIL_CORRUPT   ? CorruptJPEG
                                                       : PyExc_ValueError;
    PyErr_SetString(type, job->err.message);
    return NULL;
}

/* ---- planning the columns ---- */

/* Whether some component is upsampled horizontally by fancy (triangle) upsampling, the one step whose
 * output at a column depends on the neighbouring columns. With DCT scaling libjpeg-turbo often scales
 * chroma's IDCT up instead, so this is usually false below full size. */
static int needs_column_context(j_decompress_ptr cinfo) {
    int ci;
    if (!cinfo->do_fancy_upsampling) return 0;
    for (ci = 0; ci < cinfo->num_components; ci++) {
        jpeg_component_info *c = &cinfo->comp_info[ci];
        if (c->h_samp_factor * COMP_H_SCALED(c) < cinfo->max_h_samp_factor * MIN_H_SCALED(cinfo)) return 1;
    }
    return 0;
}

/* jpeg_crop_scanline() is exercised upstream with the standard layouts (4:4:4, 4:2:2, 4:2:0, 4:4:0,
 * grayscale); odd sampling factors decode full width, which is always correct. */
static int standard_sampling(j_decompress_ptr cinfo) {
    int ci;
    if (cinfo->num_components == 1) return 1;
    if (cinfo->max_h_samp_factor > 2 || cinfo->max_v_samp_factor > 2) return 0;
    for (ci = 1; ci < cinfo->num_components; ci++)
        if (cinfo->comp_info[ci].h_samp_factor != 1 || cinfo->comp_info[ci].v_samp_factor != 1) return 0;
    return cinfo->comp_info[0].h_samp_factor == cinfo->max_h_samp_factor &&
           cinfo->comp_info[0].v_samp_factor == cinfo->max_v_samp_factor;
}

/* Wanted scaled columns [c0, c1). With column context the decoded span is one pixel wider on each side
 * (clamped to the image) and its first column is dropped when it is not the image's edge: fancy
 * upsampling makes exactly the span's edge pixels differ from a full decode. libjpeg aligns the span's
 * start down to an iMCU column; it is also kept at least two iMCUs wide, as very narrow crops of
 * subsampled components are a poorly trodden path in libjpeg-turbo 2.1 (upsampler widths < 2). */
static void plan_columns(Job *job, JDIMENSION c0, JDIMENSION c1) {
    j_decompress_ptr cinfo = &job->cinfo;
    JDIMENSION width = cinfo->output_width, start, span, align;
    int context = needs_column_context(cinfo);

    job->full_row_bytes = (size_t)width * (size_t)job->bpp;
    if ((c0 == 0 && c1 == width) || !standard_sampling(cinfo)) {
        job->ox = 0;
        job->out_w = job->dec_w = width;
        job->drop = 0;
        return;
    }
    align = (JDIMENSION)MIN_H_SCALED(cinfo) * (cinfo->num_components == 1 ? 1 : cinfo->max_h_samp_factor);
    start = (context && c0 > 0) ? c0 - 1 : c0;
    span = ((context && c1 < width) ? c1 + 1 : c1) - start;
    if (span < 2 * align) {
        span = 2 * align;
        if (start + span > width) span = width - start;
    }
    jpeg_crop_scanline(cinfo, &start, &span); /* aligns start down, widens span to keep its end */
    job->drop = (context && start > 0) ? 1 : 0;
    job->ox = start + job->drop;
    job->out_w = c1 - job->ox;
    job->dec_w = cinfo->output_width;
}

/* ---- decoding ---- */

/* Header, parameters, start (for progressive files: all entropy decoding), column plan. */
static void start_job(Job *job, const unsigned char *data, size_t size) {
    j_decompress_ptr cinfo = &job->cinfo;
    uint64_t pixels;
    JDIMENSION c0, c1, s;
    char message[160];

    open_header(job, data, size);
    pixels = (uint64_t)cinfo->image_width * cinfo->image_height;
    if (pixels > MAX_PIXELS) {
        snprintf(message, sizeof message, "JPEG decode failed: %ux%u pixels exceeds the limit of %llu",
                 cinfo->image_width, cinfo->image_height, (unsigned long long)MAX_PIXELS);
        fail(job, FAIL_CORRUPT, message);
    }
    if (jpeg_has_multiple_scans(cinfo)) {
        const unsigned char *next = cinfo->src->next_input_byte;
        if (count_scans(next, next + cinfo->src->bytes_in_buffer, MAX_SCANS) > MAX_SCANS) {
            snprintf(message, sizeof message, "JPEG decode failed: more than %d scans (progressive DoS)", MAX_SCANS);
            fail(job, FAIL_CORRUPT, message);
        }
    }
    switch (cinfo->jpeg_color_space) {
    case JCS_GRAYSCALE: /* libjpeg-turbo expands gray to RGB itself */
    case JCS_YCbCr:
    case JCS_RGB:
        break;
    case JCS_CMYK:
    case JCS_YCCK:
        fail(job, FAIL_UNSUPPORTED, "CMYK/YCCK JPEG: not supported by fastloader.image._jpeg, decode with PIL");
        break;
    default:
        snprintf(message, sizeof message, "JPEG with %d components in an unknown colour space: not supported",
                 cinfo->num_components);
        fail(job, FAIL_UNSUPPORTED, message);
    }
    if (!job->full_box) {
        if (job->x0 < 0 || job->y0 < 0 || job->x1 > (Py_ssize_t)cinfo->image_width ||
            job->y1 > (Py_ssize_t)cinfo->image_height || job->x0 >= job->x1 || job->y0 >= job->y1) {
            snprintf(message, sizeof message, "box (%zd, %zd, %zd, %zd) is empty or outside the %ux%u image",
                     job->x0, job->y0, job->x1, job->y1, cinfo->image_width, cinfo->image_height);
            fail(job, FAIL_ARGUMENT, message);
        }
    }
    cinfo->out_color_space = job->bpp == 4 ? JCS_EXT_RGBX : JCS_RGB;
    cinfo->scale_num = 1;
    cinfo->scale_denom = (unsigned int)job->scale;
    if (job->fast) {
        cinfo->dct_method = JDCT_IFAST;
        cinfo->do_fancy_upsampling = FALSE;
    }
    job->watch_end = cinfo->arith_code && !jpeg_has_multiple_scans(cinfo);
    jpeg_start_decompress(cinfo);
    if (cinfo->output_components != job->bpp) fail(job, FAIL_UNSUPPORTED, "JPEG decoder did not produce RGB");

    s = (JDIMENSION)job->scale;
    if (job->full_box) {
        c0 = 0;
        c1 = cinfo->output_width;
        job->row0 = 0;
        job->row1 = cinfo->output_height;
    } else {
        /* Floor the start, ceil the end: the scaled box covers the requested one. */
        c0 = (JDIMENSION)job->x0 / s;
        c1 = ((JDIMENSION)job->x1 + s - 1) / s;
        job->row0 = (JDIMENSION)job->y0 / s;
        job->row1 = ((JDIMENSION)job->y1 + s - 1) / s;
        if (c1 > cinfo->output_width) c1 = cinfo->output_width;
        if (job->row1 > cinfo->output_height) job->row1 = cinfo->output_height;
    }
    plan_columns(job, c0, c1);
}

/* Rows per jpeg_read_scanlines() call when rows go straight to their place (one call yields at most
 * one iMCU row: up to 16 rows at full size). */
#define BATCH_ROWS 16
#define LEAD 4 /* bytes before the first row in the output buffer (one pixel): see read_rows() */

/* Arithmetic decoding reads zeros once its data meets a marker: legal at the end of a scan (the encoder drops
 * its final zero bytes), so a file cut short and closed with an EOI decodes to invented rows, and libjpeg warns
 * of nothing. A marker other than a restart met while whole iMCU rows are still to decode is taken for that cut.
 * A sequential scan only (job->watch_end): a progressive scan may be nearly empty by right. The price: a
 * sequential arithmetic-coded file whose last iMCU rows take no bytes at all (a flat band) is refused too. */
static void check_arith_end(Job *job) {
    j_decompress_ptr cinfo = &job->cinfo;
    int marker = cinfo->unread_marker;
    char message[160];
    if (!job->watch_end || marker == 0 || (marker >= 0xD0 && marker <= 0xD7)) return;
    if (cinfo->input_iMCU_row < cinfo->total_iMCU_rows) {
        snprintf(message, sizeof message,
                 "JPEG decode failed: arithmetic-coded data ends at iMCU row %u of %u"
                 " (truncated, or its last rows one flat colour)",
                 cinfo->input_iMCU_row, cinfo->total_iMCU_rows);
        fail(job, FAIL_CORRUPT, message);
    }
}

/* jpeg_skip_scanlines(), one iMCU row at a time where the end of the data is watched. */
static void skip_rows(Job *job, JDIMENSION count) {
    j_decompress_ptr cinfo = &job->cinfo;
    JDIMENSION step = job->watch_end ? (JDIMENSION)MIN_V_SCALED(cinfo) * cinfo->max_v_samp_factor : count;
    while (count > 0) {
        JDIMENSION k = count < step ? count : step;
        if (jpeg_skip_scanlines(cinfo, k) != k) fail(job, FAIL_CORRUPT, "JPEG decode failed: could not skip rows");
        check_arith_end(job);
        count -= k;
    }
}

/* One row into `row`, discarded. */
static void discard_row(Job *job, JSAMPROW row, int *stalls) {
    if (jpeg_read_scanlines(&job->cinfo, &row, 1) == 0 && ++*stalls > 16)
        fail(job, FAIL_CORRUPT, "JPEG decode failed: decoder made no progress");
    check_arith_end(job);
}

/* The rows below the box are entropy-decoded too (skipped: no IDCT, upsampling or colour conversion), so that a
 * file cut anywhere is refused whatever the crop: the same file is bad for every crop, in every epoch. The skip
 * starts at an iMCU row's first row (rows are read to it: the merged upsampler holds the second row of a pair,
 * and libjpeg-turbo 2.1 skips from there into an extra iMCU row, past the data). Skipping to the last row would
 * decode nothing (libjpeg then just ends the pass), so the last two iMCU rows are read too, into `scratch` (a
 * row of dec_w pixels). A multi-scan file was wholly entropy-decoded by jpeg_start_decompress(). */
static void finish_rows(Job *job, unsigned char *scratch) {
    j_decompress_ptr cinfo = &job->cinfo;
    JDIMENSION imcu = (JDIMENSION)MIN_V_SCALED(cinfo) * cinfo->max_v_samp_factor, left, tail;
    int stalls = 0;

    if (cinfo->output_scanline >= cinfo->output_height || jpeg_has_multiple_scans(cinfo)) return;
    while (cinfo->output_scanline % imcu && cinfo->output_scanline < cinfo->output_height)
        discard_row(job, scratch, &stalls);
    left = cinfo->output_height - cinfo->output_scanline;
    tail = left < 2 * imcu ? left : 2 * imcu;
    skip_rows(job, left - tail);
    while (cinfo->output_scanline < cinfo->output_height) discard_row(job, scratch, &stalls);
}

/* Skip to the first row, decode the rows into out (rows of out_w pixels, packed), then entropy-decode the
 * rest (finish_rows()).
 *
 * Copies are what this avoids: decoding into a scratch buffer and copying rows out costs ~15% of a
 * decode (measured), more than anything cropping saves on a typical crop. So rows are decoded in place:
 * - dec_w == out_w and no dropped column: straight into their slots, a batch of rows per call;
 * - otherwise one row per call (libjpeg then writes rows strictly in order, even with the merged
 *   upsampler, which keeps the second row of a pair in its own buffer): row r is decoded to start at
 *   its slot minus the dropped pixel, so its extra right pixels run into row r + 1's slot (written
 *   next) or into the tail slack, and its dropped pixel lands on row r - 1's last pixel (or the
 *   lead bytes for row 0), which is saved before and put back after. */
static void read_rows(Job *job, unsigned char *out) {
    j_decompress_ptr cinfo = &job->cinfo;
    size_t stride = (size_t)job->out_w * (size_t)job->bpp, shift = (size_t)job->drop * (size_t)job->bpp;
    JDIMENSION rows = job->row1 - job->row0, r = 0, got, k, batch;
    JSAMPROW pointers[BATCH_ROWS];
    unsigned char saved[4];
    int stalls = 0;

    batch = (job->dec_w == job->out_w && !shift) ? BATCH_ROWS : 1;
    skip_rows(job, job->row0);
    while (r < rows) {
        JDIMENSION want = rows - r < batch ? rows - r : batch;
        for (k = 0; k < want; k++) pointers[k] = out + (size_t)(r + k) * stride - shift;
        if (shift) memcpy(saved, pointers[0], shift);
        got = jpeg_read_scanlines(cinfo, pointers, want);
        if (shift) memcpy(pointers[0], saved, shift);
        if (got == 0) {
            /* A memory source never suspends; guard against a stuck decoder rather than spin. */
            if (++stalls > 16) fail(job, FAIL_CORRUPT, "JPEG decode failed: decoder made no progress");
            continue;
        }
        check_arith_end(job);
        r += got;
    }
    /* The slack after the last row (full_row_bytes, at least a decoded row) serves as the scratch row. */
    finish_rows(job, out + (size_t)rows * stride);
}

/* The two phases run without the GIL; between them the caller allocates the output with it. Each arms
 * setjmp in a frame of its own that holds no locals, so nothing live is clobbered by a longjmp. */
static int phase_header(Job *job, const unsigned char *data, size_t size) {
    if (setjmp(job->err.jump)) return -1;
    open_header(job, data, size);
    return 0;
}

static int phase_start(Job *job, const unsigned char *data, size_t size) {
    if (setjmp(job->err.jump)) return -1;
    start_job(job, data, size);
    return 0;
}

static int phase_rows(Job *job, unsigned char *out) {
    if (setjmp(job->err.jump)) return -1;
    read_rows(job, out);
    return 0;
}

/* ---- Python entry points ---- */

static PyObject *jpeg_info(PyObject *self, PyObject *args) {
    Py_buffer view;
    Job job;
    PyObject *result = NULL;
    (void)self;

    if (!PyArg_ParseTuple(args, "y*:info", &view)) return NULL;
    init_job(&job);
    /* The header is parsed with the GIL held: it is microseconds of work. */
    if (phase_header(&job, (const unsigned char *)view.buf, (size_t)view.len))
        raise_job_error(&job);
    else
        result = Py_BuildValue("(IIi)", job.cinfo.image_width, job.cinfo.image_height, job.cinfo.num_components);
    close_job(&job);
    PyBuffer_Release(&view);
    return result;
}

PyDoc_STRVAR(decode_doc,
             "decode(data, box=None, scale_denom=1, fast=False, rgbx=False) -> (buffer, offset, height, width, ox, oy)\n\n"
             "Decode box=(x0, y0, x1, y1) (full-resolution pixels; None: the whole image) at 1/scale_denom into "
             "packed RGB (or RGBX) rows: height * width * 3 (4) bytes of the bytearray from offset. (ox, oy): scaled-image "
             "coordinates of the first pixel. Raises ValueError for corrupt data or a bad box, "
             "NotImplementedError for JPEG variants left to PIL (CMYK, 12-bit, ...).");

static PyObject *jpeg_decode(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"data", "box", "scale_denom", "fast", "rgbx", NULL};
    Py_buffer view;
    PyObject *box = Py_None, *buffer = NULL, *result = NULL;
    Job job;
    int status, scale = 1, fast = 0, rgbx = 0;
    size_t size;
    (void)self;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*|Oipp:decode", keywords, &view, &box, &scale, &fast, &rgbx))
        return NULL;
    init_job(&job);
    job.scale = scale;
    job.fast = fast;
    job.bpp = rgbx ? 4 : 3;
    job.full_box = box == Py_None;
    if (scale != 1 && scale != 2 && scale != 4 && scale != 8) {
        PyErr_Format(PyExc_ValueError, "scale_denom must be 1, 2, 4 or 8, got %d", scale);
        goto done;
    }
    if (!job.full_box && !PyArg_ParseTuple(box, "nnnn;box must be a tuple (x0, y0, x1, y1) of ints", &job.x0,
                                           &job.y0, &job.x1, &job.y1))
        goto done;

    Py_BEGIN_ALLOW_THREADS
    status = phase_start(&job, (const unsigned char *)view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS
    if (status) {
        raise_job_error(&job);
        goto done;
    }
    /* Lead: the 3 bytes row 0's dropped pixel lands on; tail: room for the last row's extra right
     * pixels (at most a full uncropped row). See read_rows(). */
    size = LEAD + (size_t)(job.row1 - job.row0) * job.out_w * (size_t)job.bpp + job.full_row_bytes;
    buffer = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (buffer == NULL) goto done;
    Py_BEGIN_ALLOW_THREADS
    status = phase_rows(&job, (unsigned char *)PyByteArray_AS_STRING(buffer) + LEAD);
    Py_END_ALLOW_THREADS
    if (status) {
        raise_job_error(&job);
        goto done;
    }
    result = Py_BuildValue("(OiIIII)", buffer, LEAD, job.row1 - job.row0, job.out_w, job.ox, job.row0);

done:
    close_job(&job);
    Py_XDECREF(buffer);
    PyBuffer_Release(&view);
    return result;
}

/* ---- decoding and resizing into a batch slot, in one call ---- */

/* The decoded rows, resized into the target. source: the box in scaled-image pixels; crop: the box is
 * whole pixels and the filter must see nothing outside it (crop, then resize: RandomResizedCrop), else
 * it reads the neighbours as far as the decoded rows go (resize with a box: Resize + CenterCrop).
 * Returns 0, -1 when the rows do not cover the box (a planning bug), -2 when memory ran out. */
static int resize_rows(Job *job, const unsigned char *pixels, const double source[4], int crop, unsigned char *dst,
                       Py_ssize_t dst_stride, int out_w, int out_h, int filter, int flip) {
    ptrdiff_t stride = (ptrdiff_t)job->out_w * job->bpp;
    int got_w = (int)job->out_w, got_h = (int)(job->row1 - job->row0);
    double ox = job->ox, oy = job->row0;
    double need_x1 = fmin(ceil(source[2]), job->cinfo.output_width);
    double need_y1 = fmin(ceil(source[3]), job->cinfo.output_height);
    float box[4];

    if (ox > floor(source[0]) || oy > floor(source[1]) || ox + got_w < need_x1 || oy + got_h < need_y1) return -1;
    box[0] = (float)(source[0] - ox);
    box[1] = (float)(source[1] - oy);
    box[2] = (float)(source[2] - ox);
    box[3] = (float)(source[3] - oy);
    if (crop) {
        int x0 = (int)floor(box[0] + 0.5), y0 = (int)floor(box[1] + 0.5);
        int x1 = (int)floor(box[2] + 0.5), y1 = (int)floor(box[3] + 0.5);
        if (x0 < 0 || y0 < 0 || x1 > got_w || y1 > got_h || x0 >= x1 || y0 >= y1) return -1;
        pixels += (ptrdiff_t)y0 * stride + (ptrdiff_t)x0 * job->bpp;
        got_w = x1 - x0;
        got_h = y1 - y0;
        box[0] = box[1] = 0.0f;
        box[2] = (float)got_w;
        box[3] = (float)got_h;
    }
    return fl_resample(pixels, stride, got_w, got_h, box, dst, dst_stride, out_w, out_h, filter, flip) ? -2 : 0;
}

PyDoc_STRVAR(decode_resized_doc,
             "decode_resized(data, box, scale_denom, fast, source, crop, out, flip, filter) -> None\n\n"
             "Decode box=(x0, y0, x1, y1) (full-resolution pixels, with the filter's margin) at 1/scale_denom, "
             "resize the part source=(x0, y0, x1, y1) of it (fractional pixels of the scaled image) into out, a "
             "writable uint8 (H, W, 3) buffer with packed pixels (any row stride), mirrored when flip. crop: "
             "source is whole pixels and the filter sees nothing outside it. filter: 0 box, 1 bilinear, 2 hamming, "
             "3 bicubic, 4 lanczos. Errors as decode(); RuntimeError if the decoded rows miss source.");

/* One image decoded and resized into dst, without the GIL (job: init_job'd, its box, scale and fast set).
 * 0, or resize_rows()'s -1 / -2, -1 also when libjpeg failed (job->err.kind then says how), -3 out of memory. */
static int decode_resize_job(Job *job, const unsigned char *data, size_t size, const double source[4], int crop,
                             unsigned char *dst, Py_ssize_t dst_stride, int out_w, int out_h, int filter, int flip) {
    unsigned char *pixels;
    int status;

    job->bpp = 4;
    status = phase_start(job, data, size);
    if (status) return status;
    /* The thread's own buffer, kept for its next image: fresh memory each time is new pages each time. */
    pixels = fl_thread_buffer(FL_BUFFER_DECODE,
                              LEAD + (size_t)(job->row1 - job->row0) * job->out_w * (size_t)job->bpp + job->full_row_bytes);
    if (pixels == NULL) return -3;
    status = phase_rows(job, pixels + LEAD);
    if (status) return status;
    return resize_rows(job, pixels + LEAD, source, crop, dst, dst_stride, out_w, out_h, filter, flip);
}

/* The Python error for a failed decode_resize_job (the caller holds the GIL). */
static void raise_resize_error(Job *job, int status, const double source[4]) {
    if (status == -1 && job->err.kind != 0)
        raise_job_error(job); /* libjpeg's failure: corrupt or unsupported data */
    else if (status == -1) {
        char message[256]; /* PyErr_Format has no float formats */
        snprintf(message, sizeof message,
                 "decode_resized: the rows decoded for box (%zd, %zd, %zd, %zd) miss (%g, %g, %g, %g)", job->x0, job->y0,
                 job->x1, job->y1, source[0], source[1], source[2], source[3]);
        PyErr_SetString(PyExc_RuntimeError, message);
    } else
        PyErr_NoMemory();
}

static int valid_scale_and_filter(int scale, int filter) {
    if ((scale == 1 || scale == 2 || scale == 4 || scale == 8) && filter >= 0 && filter < FL_FILTERS) return 1;
    PyErr_Format(PyExc_ValueError, "decode_resized: bad scale_denom %d or filter %d", scale, filter);
    return 0;
}

/* No side of a JPEG is longer (libjpeg's limit is 65,500): a source reaching past it is in no image. */
#define MAX_SIDE 65536

/* source resized to out_w x out_h: finite, not empty, inside the largest image, and planned in at most
 * FL_MAX_AXIS_WEIGHTS weights an axis (a huge box or output would have the plan run out of memory). A
 * pixel more than the box's width and height: a crop's rounding, the float box's. `what`: the call, or
 * the call and the job. 1, or 0 with ValueError set. */
static int valid_source(const double source[4], int out_w, int out_h, int filter, const char *what) {
    char message[320]; /* PyErr_Format has no float formats */
    const char *axis = NULL;
    int i;
    for (i = 0; i < 4 && isfinite(source[i]); i++) {}
    if (i < 4 || !(source[0] < source[2]) || !(source[1] < source[3])) {
        snprintf(message, sizeof message, "%s: source (%g, %g, %g, %g) is not a box (x0 < x1, y0 < y1, finite)",
                 what, source[0], source[1], source[2], source[3]);
        PyErr_SetString(PyExc_ValueError, message);
        return 0;
    }
    if (source[2] > MAX_SIDE || source[3] > MAX_SIDE) {
        snprintf(message, sizeof message, "%s: source (%g, %g, %g, %g) reaches past %d pixels, the longest side "
                 "of any JPEG", what, source[0], source[1], source[2], source[3], MAX_SIDE);
        PyErr_SetString(PyExc_ValueError, message);
        return 0;
    }
    if (fl_axis_weights(source[2] - source[0] + 1.0, out_w, filter) > FL_MAX_AXIS_WEIGHTS)
        axis = "x";
    else if (fl_axis_weights(source[3] - source[1] + 1.0, out_h, filter) > FL_MAX_AXIS_WEIGHTS)
        axis = "y";
    if (axis == NULL) return 1;
    snprintf(message, sizeof message,
             "%s: source (%g, %g, %g, %g) resized to %dx%d takes more than %zu filter weights along %s, the "
             "limit of an axis",
             what, source[0], source[1], source[2], source[3], out_w, out_h, FL_MAX_AXIS_WEIGHTS, axis);
    PyErr_SetString(PyExc_ValueError, message);
    return 0;
}

/* A writable uint8 buffer of `ndim` dimensions, the last two (W, 3) with packed pixels. */
static int get_pixels(PyObject *out, Py_buffer *target, int ndim, const char *what) {
    int d;
    if (PyObject_GetBuffer(out, target, PyBUF_RECORDS) < 0) return 0;
    if (target->ndim == ndim && target->itemsize == 1 && target->shape[ndim - 1] == 3 &&
        target->strides[ndim - 1] == 1 && target->strides[ndim - 2] == 3 && target->shape[ndim - 2] <= INT32_MAX / 3) {
        for (d = 0; d < ndim - 1 && target->shape[d] >= 1 && target->shape[d] <= INT32_MAX; d++) {}
        if (d == ndim - 1) return 1;
    }
    PyErr_Format(PyExc_ValueError, "decode_resized: %s must be a non-empty uint8 %s with packed pixels", what,
                 ndim == 3 ? "(H, W, 3)" : "(N, H, W, 3)");
    PyBuffer_Release(target);
    return 0;
}

static PyObject *jpeg_decode_resized(PyObject *self, PyObject *args) {
    Py_buffer view, target;
    PyObject *out;
    Job job;
    double source[4];
    int scale, fast, crop, flip, filter, status;
    (void)self;

    init_job(&job);
    if (!PyArg_ParseTuple(args, "y*(nnnn)ip(dddd)pOpi:decode_resized", &view, &job.x0, &job.y0, &job.x1, &job.y1,
                          &scale, &fast, &source[0], &source[1], &source[2], &source[3], &crop, &out, &flip, &filter))
        return NULL;
    if (!valid_scale_and_filter(scale, filter) || !get_pixels(out, &target, 3, "out")) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (!valid_source(source, (int)target.shape[1], (int)target.shape[0], filter, "decode_resized")) {
        PyBuffer_Release(&target);
        PyBuffer_Release(&view);
        return NULL;
    }
    job.scale = scale;
    job.fast = fast;

    Py_BEGIN_ALLOW_THREADS
    status = decode_resize_job(&job, (const unsigned char *)view.buf, (size_t)view.len, source, crop,
                               (unsigned char *)target.buf, target.strides[0], (int)target.shape[1],
                               (int)target.shape[0], filter, flip);
    fl_thread_buffers_trim();
    Py_END_ALLOW_THREADS

    if (status) raise_resize_error(&job, status, source);
    close_job(&job);
    PyBuffer_Release(&target);
    PyBuffer_Release(&view);
    if (status) return NULL;
    Py_RETURN_NONE;
}

/* ---- a whole batch in one call ---- */

/* One image of a batch: its bytes, what to decode, where its pixels go, and how it ended. */
typedef struct {
    Py_buffer view;
    Py_ssize_t box[4];
    double source[4];
    int scale, crop, flip, filter, status, kind;
    unsigned char *dst;
    int out_w, out_h;
    char message[JMSG_LENGTH_MAX + 64];
} BatchImage;

/* The image's data was at fault (libjpeg refused it): the image's alone, the caller decodes it otherwise. */
static int data_fault(const BatchImage *image) {
    return image->status == -1 && (image->kind == FAIL_CORRUPT || image->kind == FAIL_UNSUPPORTED);
}

static void batch_job(Job *job, const BatchImage *image, int fast) {
    init_job(job);
    job->x0 = image->box[0];
    job->y0 = image->box[1];
    job->x1 = image->box[2];
    job->y1 = image->box[3];
    job->scale = image->scale;
    job->fast = fast;
}

/* Parse jobs[i] into image (with the GIL): 1, or 0 with a Python error set. */
static int parse_batch_image(PyObject *job, Py_ssize_t i, const Py_buffer *target, BatchImage *image) {
    Py_ssize_t slot, rect[4];
    char what[64];
    if (!PyTuple_Check(job)) {
        PyErr_Format(PyExc_TypeError, "decode_resized_batch: job %zd is not a tuple", i);
        return 0;
    }
    if (!PyArg_ParseTuple(job, "y*(nnnn)i(dddd)pn(nnnn)pi:decode_resized_batch", &image->view, &image->box[0],
                          &image->box[1], &image->box[2], &image->box[3], &image->scale, &image->source[0],
                          &image->source[1], &image->source[2], &image->source[3], &image->crop, &slot, &rect[0],
                          &rect[1], &rect[2], &rect[3], &image->flip, &image->filter))
        return 0;
    if (!valid_scale_and_filter(image->scale, image->filter)) goto bad;
    if (slot < 0 || slot >= target->shape[0] || rect[0] < 0 || rect[1] < 0 || rect[2] > target->shape[2] ||
        rect[3] > target->shape[1] || rect[0] >= rect[2] || rect[1] >= rect[3]) {
        PyErr_Format(PyExc_ValueError, "decode_resized_batch: job %zd: slot %zd or rectangle (%zd, %zd, %zd, %zd) "
                     "outside out's %zd slots of %zdx%zd", i, slot, rect[0], rect[1], rect[2], rect[3],
                     target->shape[0], target->shape[2], target->shape[1]);
        goto bad;
    }
    image->dst = (unsigned char *)target->buf + slot * target->strides[0] + rect[1] * target->strides[1] + rect[0] * 3;
    image->out_w = (int)(rect[2] - rect[0]);
    image->out_h = (int)(rect[3] - rect[1]);
    snprintf(what, sizeof what, "decode_resized_batch: job %zd", i);
    if (!valid_source(image->source, image->out_w, image->out_h, image->filter, what)) goto bad;
    return 1;
bad:
    PyBuffer_Release(&image->view);
    return 0;
}

/* Threads one batch may decode on (the calling thread and its helpers). */
#define MAX_THREADS 16

/* A batch being decoded: each thread takes the next image until none is left or one ended the batch. */
typedef struct {
    BatchImage *images;
    Py_ssize_t count, row_stride, next; /* next: the next image to take, shared (atomic) */
    int fast, stop;                     /* stop: an image ended the batch (atomic) */
} BatchRun;

/* Decode images of the run until there are none left: on every thread of the batch, without the GIL.
 * Each image is decoded wholly on the thread that takes it (libjpeg-turbo keeps its SIMD state per thread). */
static void *run_batch(void *arg) {
    BatchRun *run = arg;
    for (;;) {
        Py_ssize_t i = __atomic_fetch_add(&run->next, 1, __ATOMIC_RELAXED);
        BatchImage *image;
        Job job;
        if (i >= run->count || __atomic_load_n(&run->stop, __ATOMIC_RELAXED)) break;
        image = &run->images[i];
        batch_job(&job, image, run->fast);
        image->status = decode_resize_job(&job, (const unsigned char *)image->view.buf, (size_t)image->view.len,
                                          image->source, image->crop, image->dst, run->row_stride, image->out_w,
                                          image->out_h, image->filter, image->flip);
        image->kind = job.err.kind;
        if (image->status) memcpy(image->message, job.err.message, sizeof image->message);
        close_job(&job);
        if (image->status && !data_fault(image)) __atomic_store_n(&run->stop, 1, __ATOMIC_RELAXED);
    }
    fl_thread_buffers_trim();
    return NULL;
}

/* Up to `wanted` helper threads running run_batch; returns how many started (0 is fine: the caller's
 * thread decodes the whole batch alone). */
static Py_ssize_t start_helpers(BatchRun *run, pthread_t *helpers, int wanted) {
    Py_ssize_t started = 0;
    /* No more helpers than images the caller's thread would leave them. */
    if (wanted > run->count - 1) wanted = run->count > 1 ? (int)run->count - 1 : 0;
    while (started < wanted && pthread_create(&helpers[started], NULL, run_batch, run) == 0) started++;
    return started;
}

PyDoc_STRVAR(decode_resized_batch_doc,
             "decode_resized_batch(jobs, out, fast, threads=1) -> [(position, unsupported, message), ...]\n\n"
             "decode_resized for a whole batch without the GIL in between, on `threads` threads (the caller's and "
             "helpers started for the call). jobs: a sequence (copied first). out: a writable uint8 (N, H, W, 3) "
             "buffer with packed pixels. Each job: (data, box, scale_denom, source, crop, slot, rect, flip, filter), "
             "as decode_resized's arguments, the image going to out[slot] at rect=(u0, v0, u1, v1) (already "
             "mirrored for flip). Returns the jobs whose data libjpeg refused (unsupported: True for JPEG variants "
             "left to PIL, False for corrupt data); the other jobs are decoded. RuntimeError if the decoded rows of "
             "a job miss its source (a planning bug).");

static PyObject *jpeg_decode_resized_batch(PyObject *self, PyObject *args) {
    PyObject *job_list, *jobs, *out, *result = NULL;
    Py_buffer target;
    BatchImage *images;
    BatchRun run = {0};
    pthread_t helpers[MAX_THREADS - 1];
    Py_ssize_t count, parsed = 0, i, bad = -1, started;
    int fast, threads = 1;
    (void)self;

    if (!PyArg_ParseTuple(args, "OOp|i:decode_resized_batch", &job_list, &out, &fast, &threads)) return NULL;
    if (threads < 1 || threads > MAX_THREADS) {
        PyErr_Format(PyExc_ValueError, "decode_resized_batch: threads must be 1 to %d, got %d", MAX_THREADS, threads);
        return NULL;
    }
    /* The jobs as a tuple of our own, held to the end: reading a job's fields can run Python (an __index__,
     * a __float__) that changes the caller's list, and the jobs it held would go with it. */
    jobs = PySequence_Tuple(job_list);
    if (jobs == NULL) return NULL;
    if (!get_pixels(out, &target, 4, "out")) {
        Py_DECREF(jobs);
        return NULL;
    }
    count = PyTuple_GET_SIZE(jobs);
    images = PyMem_Calloc(count ? (size_t)count : 1, sizeof *images);
    if (images == NULL) {
        PyBuffer_Release(&target);
        Py_DECREF(jobs);
        return PyErr_NoMemory();
    }
    /* Each job's buffer view holds its bytes: valid while the GIL is released. */
    for (; parsed < count; parsed++)
        if (!parse_batch_image(PyTuple_GET_ITEM(jobs, parsed), parsed, &target, &images[parsed])) goto done;

    run.images = images;
    run.count = count;
    run.row_stride = target.strides[1];
    run.fast = fast;
    Py_BEGIN_ALLOW_THREADS
    started = start_helpers(&run, helpers, threads - 1);
    run_batch(&run);
    for (i = 0; i < started; i++) pthread_join(helpers[i], NULL);
    Py_END_ALLOW_THREADS
    /* The first image that ended the batch (a planning bug, no memory); the images after it may not have run. */
    for (i = 0; i < count && bad < 0; i++)
        if (images[i].status && !data_fault(&images[i])) bad = i;

    if (bad >= 0) {
        BatchImage *image = &images[bad];
        Job job; /* only to phrase the error as decode_resized would */
        batch_job(&job, image, fast);
        job.err.kind = image->kind;
        memcpy(job.err.message, image->message, sizeof job.err.message);
        raise_resize_error(&job, image->status, image->source);
        goto done;
    }
    result = PyList_New(0);
    for (i = 0; result != NULL && i < count; i++) {
        PyObject *failure;
        if (images[i].status == 0) continue;
        failure = Py_BuildValue("(nOs)", i, images[i].kind == FAIL_UNSUPPORTED ? Py_True : Py_False,
                                images[i].message);
        if (failure == NULL || PyList_Append(result, failure) < 0) Py_CLEAR(result);
        Py_XDECREF(failure);
    }

done:
    for (i = 0; i < parsed; i++) PyBuffer_Release(&images[i].view);
    PyMem_Free(images);
    PyBuffer_Release(&target);
    Py_DECREF(jobs);
    return result;
}

PyDoc_STRVAR(set_pass_order_doc,
             "set_pass_order(order) -> previous order\n\n"
             "Which resize pass runs first where both change the image, as the PIL matched runs them: 0 the "
             "horizontal always (Pillow-SIMD, Pillow before 13), 1 the vertical when the height loses more pixels "
             "than twice what the width loses (Pillow 13). For every thread; set it before resizing.");

static PyObject *jpeg_set_pass_order(PyObject *self, PyObject *args) {
    int order, previous = fl_resample_order();
    (void)self;
    if (!PyArg_ParseTuple(args, "i:set_pass_order", &order)) return NULL;
    if (order < 0 || order >= FL_ORDERS) {
        PyErr_Format(PyExc_ValueError, "set_pass_order: order must be 0 to %d, got %d", FL_ORDERS - 1, order);
        return NULL;
    }
    fl_resample_set_order(order);
    return PyLong_FromLong(previous);
}

/* ---- packing a resized image into its batch slot ---- */

/* The Arrow C data interface (arrow.apache.org/docs/format/CDataInterface.html): a stable ABI, declared
 * here because Pillow (>= 11.2) exports an image's pixels through it without a copy. */
struct ArrowSchema {
    const char *format, *name, *metadata;
    int64_t flags, n_children;
    struct ArrowSchema **children, *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};

struct ArrowArray {
    int64_t length, null_count, offset, n_buffers, n_children;
    const void **buffers;
    struct ArrowArray **children, *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

/* Four 4-byte pixels (two little-endian words: R G B X R G B X) as 12 bytes of packed RGB. */
static void pack4(uint64_t a, uint64_t b, unsigned char *dst) {
    uint64_t lo = (a & 0xFFFFFFu) | ((a >> 8) & 0xFFFFFF000000u) | ((b & 0xFFFFu) << 48);
    uint32_t hi = (uint32_t)(((b >> 16) & 0xFFu) | ((b >> 24) & 0xFFFFFF00u));
    memcpy(dst, &lo, 8);
    memcpy(dst + 8, &hi, 4);
}

/* One row of 4-byte pixels (RGB + a pad byte, how PIL holds RGB) to packed RGB, mirrored when flip:
 * four pixels per step on little-endian machines, one at a time elsewhere. */
static void pack_row(const unsigned char *src, unsigned char *dst, Py_ssize_t width, int flip) {
    Py_ssize_t x = 0;
    const unsigned char *end = src + 4 * width;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t a, b;
    uint32_t p[4];
    if (!flip) {
        for (; x + 4 <= width; x += 4, src += 16, dst += 12) {
            memcpy(&a, src, 8);
            memcpy(&b, src + 8, 8);
            pack4(a, b, dst);
        }
    } else {
        for (; x + 4 <= width; x += 4, end -= 16, dst += 12) {
            memcpy(p, end - 16, 16); /* pixels x+3 .. x, in memory order */
            pack4((uint64_t)p[3] | ((uint64_t)p[2] << 32), (uint64_t)p[1] | ((uint64_t)p[0] << 32), dst);
        }
    }
#endif
    for (; x < width; x++, dst += 3) {
        if (flip) {
            end -= 4;
            memcpy(dst, end, 3);
        } else {
            memcpy(dst, src, 3);
            src += 4;
        }
    }
}

PyDoc_STRVAR(pack_rgb_doc,
             "pack_rgb(arrow, out, flip) -> None\n\n"
             "Copy an RGB/RGBX PIL image, exported as Pillow's (schema, array) Arrow capsules, into out: a "
             "writable uint8 (H, W, 3) buffer whose pixels and channels are packed (any row stride). "
             "flip mirrors it left to right. ValueError if the export or out is not of that shape.");

static PyObject *pack_rgb(PyObject *self, PyObject *args) {
    PyObject *arrow, *out;
    int flip = 0;
    Py_buffer view;
    struct ArrowSchema *schema;
    struct ArrowArray *array, *child;
    const unsigned char *pixels;
    Py_ssize_t height, width, y;
    (void)self;

    if (!PyArg_ParseTuple(args, "O!Op:pack_rgb", &PyTuple_Type, &arrow, &out, &flip)) return NULL;
    if (PyTuple_GET_SIZE(arrow) != 2) {
        PyErr_SetString(PyExc_ValueError, "pack_rgb: expected the (schema, array) pair of __arrow_c_array__()");
        return NULL;
    }
    schema = PyCapsule_GetPointer(PyTuple_GET_ITEM(arrow, 0), "arrow_schema");
    if (schema == NULL) return NULL;
    array = PyCapsule_GetPointer(PyTuple_GET_ITEM(arrow, 1), "arrow_array");
    if (array == NULL) return NULL;
    /* A fixed-size list of 4 uint8 per pixel, one child holding the bytes: how Pillow exports 4-band images. */
    if (strcmp(schema->format, "+w:4") != 0 || schema->n_children != 1 || strcmp(schema->children[0]->format, "C") != 0 ||
        array->n_children != 1 || array->children[0]->n_buffers != 2 || array->children[0]->buffers[1] == NULL) {
        PyErr_Format(PyExc_ValueError, "pack_rgb: not an image of 4-byte pixels (Arrow format %s)", schema->format);
        return NULL;
    }
    child = array->children[0];
    if (PyObject_GetBuffer(out, &view, PyBUF_RECORDS) < 0) return NULL;
    if (view.ndim != 3 || view.itemsize != 1 || view.shape[2] != 3 || view.strides[2] != 1 || view.strides[1] != 3 ||
        view.shape[0] * view.shape[1] != array->length || child->length < 4 * (array->offset + array->length)) {
        PyErr_Format(PyExc_ValueError, "pack_rgb: out must be uint8 (H, W, 3) with packed pixels for %lld pixels",
                     (long long)array->length);
        PyBuffer_Release(&view);
        return NULL;
    }
    height = view.shape[0];
    width = view.shape[1];
    pixels = (const unsigned char *)child->buffers[1] + 4 * (child->offset + array->offset);
    for (y = 0; y < height; y++)
        pack_row(pixels + 4 * width * y, (unsigned char *)view.buf + view.strides[0] * y, width, flip);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"info", jpeg_info, METH_VARARGS,
     "info(data) -> (width, height, n_components) from the JPEG header; ValueError if it is not one."},
    {"decode", (PyCFunction)(void (*)(void))jpeg_decode, METH_VARARGS | METH_KEYWORDS, decode_doc},
    {"decode_resized", jpeg_decode_resized, METH_VARARGS, decode_resized_doc},
    {"decode_resized_batch", jpeg_decode_resized_batch, METH_VARARGS, decode_resized_batch_doc},
    {"set_pass_order", jpeg_set_pass_order, METH_VARARGS, set_pass_order_doc},
    {"pack_rgb", pack_rgb, METH_VARARGS, pack_rgb_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "fastloader.image._jpeg",
    .m_doc = "Partial JPEG decoding with libjpeg-turbo (see jpeg_ext.py).",
    .m_size = -1,
    .m_methods = methods,
};

/* Free-threaded Python (3.13t, 3.14t): the module declares that it does not need the GIL, so importing it
 * does not turn the GIL back on. What it shares between threads is safe without it: CorruptJPEG is made here,
 * once, under the import lock; the resize's per-thread buffers hang off a pthread key made under
 * pthread_once; the SIMD choice (fl_resample_simd) is made here, before any thread can ask, and read
 * atomically; the pass order is stored and read atomically. Every call works on the buffers its caller passed,
 * with the GIL released (or not held) while libjpeg runs, as on a GIL build. */
PyMODINIT_FUNC PyInit__jpeg(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
#ifdef Py_GIL_DISABLED
    if (PyUnstable_Module_SetGIL(m, Py_MOD_GIL_NOT_USED) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#endif
    CorruptJPEG = PyErr_NewException("fastloader.image._jpeg.CorruptJPEG", PyExc_ValueError, NULL);
    if (CorruptJPEG == NULL || PyModule_AddObjectRef(m, "CorruptJPEG", CorruptJPEG) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION", LIBJPEG_TURBO_VERSION_NUMBER) < 0 ||
        PyModule_AddIntConstant(m, "MAX_PIXELS", (long)MAX_PIXELS) < 0 ||
        PyModule_AddIntConstant(m, "MAX_SCANS", MAX_SCANS) < 0 ||
        PyModule_AddIntConstant(m, "MAX_THREADS", MAX_THREADS) < 0 ||
        PyModule_AddIntConstant(m, "MAX_AXIS_WEIGHTS", (long)FL_MAX_AXIS_WEIGHTS) < 0 ||
        PyModule_AddIntConstant(m, "RESIZE_SIMD", fl_resample_simd()) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
