/* Antialiased resize of decoded RGBX rows straight into a packed RGB batch slot (see _resample.c). */
#ifndef FASTLOADER_RESAMPLE_H
#define FASTLOADER_RESAMPLE_H

#include <stddef.h>
#include <stdint.h>

/* PIL's convolution filters, in the order of fastloader.image.decode's filter codes. */
enum { FL_BOX = 0, FL_BILINEAR, FL_HAMMING, FL_BICUBIC, FL_LANCZOS, FL_FILTERS };

/* Resize the part box = (x0, y0, x1, y1) (fractional pixels) of src, src_w x src_h RGBX pixels (4 bytes
 * each, rows src_stride bytes apart), to out_w x out_h packed RGB pixels at dst (rows dst_stride bytes
 * apart), mirrored left to right when flip. The filter reaches past the box as far as src goes, never
 * further (src's edges are the image's). Returns 0, or -1 when memory ran out. Needs no GIL. */
int fl_resample(const uint8_t *src, ptrdiff_t src_stride, int src_w, int src_h, const float box[4], uint8_t *dst,
                ptrdiff_t dst_stride, int out_w, int out_h, int filter, int flip);

/* Scratch memory of the calling thread, at least `bytes` long, kept for its next call (which: one of
 * FL_BUFFERS independent buffers); freed when the thread ends. NULL when memory ran out. */
enum { FL_BUFFER_DECODE = 0, FL_BUFFER_RESAMPLE, FL_BUFFERS };
void *fl_thread_buffer(int which, size_t bytes);
/* Frees the calling thread's buffers that one huge image grew past what is worth keeping. */
void fl_thread_buffers_trim(void);

/* Whether fl_resample runs its AVX2 passes on this CPU (else plain C, slower than PIL's SIMD). */
int fl_resample_simd(void);

#endif
