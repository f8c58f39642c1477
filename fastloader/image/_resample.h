/* Antialiased resize of decoded RGBX rows straight into a packed RGB batch slot (see _resample.c). */
#ifndef FASTLOADER_RESAMPLE_H
#define FASTLOADER_RESAMPLE_H

#include <stddef.h>
#include <stdint.h>

/* PIL's convolution filters, in the order of fastloader.image.decode's filter codes. */
enum { FL_BOX = 0, FL_BILINEAR, FL_HAMMING, FL_BICUBIC, FL_LANCZOS, FL_FILTERS };

/* The most weights the plan of one axis may hold (taps x output pixels; 4 bytes each, and 8 while it is
 * planned): far more than any image's axis needs (a 65,535-px side to 1 px by Lanczos: 393,217), far less
 * than memory runs out at. */
#define FL_MAX_AXIS_WEIGHTS ((size_t)1 << 22)

/* The weights the plan of an axis of `length` input pixels resized to out_size pixels holds; SIZE_MAX
 * past FL_MAX_AXIS_WEIGHTS (and for a length not finite, a bad filter or out_size). Needs no GIL. */
size_t fl_axis_weights(double length, int out_size, int filter);

/* Resize the part box = (x0, y0, x1, y1) (fractional pixels) of src, src_w x src_h RGBX pixels (4 bytes
 * each, rows src_stride bytes apart), to out_w x out_h packed RGB pixels at dst (rows dst_stride bytes
 * apart), mirrored left to right when flip. The filter reaches past the box as far as src goes, never
 * further (src's edges are the image's). Returns 0, or -1 when memory ran out or an axis would take more
 * than FL_MAX_AXIS_WEIGHTS (callers check fl_axis_weights first). Needs no GIL. */
int fl_resample(const uint8_t *src, ptrdiff_t src_stride, int src_w, int src_h, const float box[4], uint8_t *dst,
                ptrdiff_t dst_stride, int out_w, int out_h, int filter, int flip);

/* Which pass runs first where both change the image, as the PIL the process matches runs them: the
 * horizontal always (Pillow-SIMD, Pillow before 13), or the vertical when the height loses more pixels than
 * twice what the width loses (Pillow 13). The same integers otherwise. Set once, before resizing. */
enum { FL_ORDER_HORIZONTAL_FIRST = 0, FL_ORDER_PILLOW_13, FL_ORDERS };
void fl_resample_set_order(int order);
int fl_resample_order(void);

/* Scratch memory of the calling thread, at least `bytes` long, kept for its next call (which: one of
 * FL_BUFFERS independent buffers); freed when the thread ends. NULL when memory ran out. */
enum { FL_BUFFER_DECODE = 0, FL_BUFFER_RESAMPLE, FL_BUFFERS };
void *fl_thread_buffer(int which, size_t bytes);
/* Frees the calling thread's buffers that one huge image grew past what is worth keeping. */
void fl_thread_buffers_trim(void);

/* Whether fl_resample runs its AVX2 passes on this CPU (else plain C, slower than PIL's SIMD). */
int fl_resample_simd(void);

#endif
