/* Scaled JPEG decode through the system libjpeg(-turbo), for src/data/jpeg.rs.
 *
 * libjpeg reports fatal errors by calling error_exit, which must not return; longjmp back here
 * keeps that inside C (Rust frames are never unwound through). Warnings are counted by kind so
 * the Rust side can tell a file cut inside its compressed data from one that only lacks the
 * final end-of-image marker. */
#include <setjmp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <jpeglib.h>
#include <jerror.h>

enum {
  PP_OK = 0,
  PP_ERROR = 1,     /* libjpeg refused the file: msg says why */
  PP_TOO_LARGE = 2, /* header read, pixels above the limit: not decoded */
  PP_NO_BUFFER = 3, /* the caller could not provide the output buffer */
  PP_UNSUPPORTED = 4, /* CMYK/YCCK: libjpeg-turbo does not convert these to RGB */
};

/* Warning bits in pp_result.warnings. */
#define PP_W_DATA_ENDED 1u  /* the compressed data ran out in a scan (JWRN_HIT_MARKER) */
#define PP_W_EOF 2u         /* the file ended before its EOI marker (JWRN_JPEG_EOF) */
#define PP_W_CORRUPT 4u     /* bad Huffman code / corrupt data warnings */

typedef struct {
  unsigned width, height;         /* full size, from the header */
  unsigned out_w, out_h, out_c;   /* decoded size and channels */
  unsigned warnings;
  char msg[JMSG_LENGTH_MAX];
} pp_result;

typedef unsigned char *(*pp_alloc_fn)(void *ctx, size_t len);

struct pp_err {
  struct jpeg_error_mgr pub;
  jmp_buf jb;
  unsigned *warnings;
};

static void pp_error_exit(j_common_ptr c) {
  struct pp_err *e = (struct pp_err *)c->err;
  longjmp(e->jb, 1);
}

static void pp_emit(j_common_ptr c, int level) {
  struct pp_err *e = (struct pp_err *)c->err;
  if (level >= 0) return; /* trace messages */
  c->err->num_warnings++;
  switch (c->err->msg_code) {
  case JWRN_HIT_MARKER: *e->warnings |= PP_W_DATA_ENDED; break;
  case JWRN_JPEG_EOF: *e->warnings |= PP_W_EOF; break;
  case JWRN_HUFF_BAD_CODE:
  case JWRN_NOT_SEQUENTIAL:
  case JWRN_MUST_RESYNC: *e->warnings |= PP_W_CORRUPT; break;
  default: break;
  }
}

/* Decodes `buf` at the smallest 1/2^k scale (k ≤ 3) whose output is still at least
 * target_w × target_h (no scaling when a target is 0), as RGB or (gray == 1) luma, or (gray == 2)
 * luma for a grayscale file and RGB for a colour one, into a buffer
 * the caller's `alloc` returns. */
int pp_jpeg_decode(const unsigned char *buf, unsigned long len, unsigned target_w, unsigned target_h,
                   int gray, unsigned long long max_pixels, pp_alloc_fn alloc, void *ctx, pp_result *r) {
  struct jpeg_decompress_struct cinfo;
  struct pp_err err;
  memset(r, 0, sizeof *r);
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = pp_error_exit;
  err.pub.emit_message = pp_emit;
  err.warnings = &r->warnings;
  if (setjmp(err.jb)) {
    (*cinfo.err->format_message)((j_common_ptr)&cinfo, r->msg);
    jpeg_destroy_decompress(&cinfo);
    return PP_ERROR;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, buf, len);
  jpeg_read_header(&cinfo, TRUE);
  r->width = cinfo.image_width;
  r->height = cinfo.image_height;
  if ((unsigned long long)cinfo.image_width * cinfo.image_height > max_pixels) {
    jpeg_destroy_decompress(&cinfo);
    return PP_TOO_LARGE;
  }
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(&cinfo);
    return PP_UNSUPPORTED;
  }
  unsigned denom = 1;
  if (target_w > 0 && target_h > 0) {
    while (denom < 8 && (cinfo.image_width + 2 * denom - 1) / (2 * denom) >= target_w &&
           (cinfo.image_height + 2 * denom - 1) / (2 * denom) >= target_h)
      denom *= 2;
  }
  cinfo.scale_num = 1;
  cinfo.scale_denom = denom;
  cinfo.out_color_space =
      (gray == 1 || (gray == 2 && cinfo.jpeg_color_space == JCS_GRAYSCALE)) ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  r->out_w = cinfo.output_width;
  r->out_h = cinfo.output_height;
  r->out_c = cinfo.output_components;
  size_t stride = (size_t)cinfo.output_width * cinfo.output_components;
  unsigned char *out = alloc(ctx, stride * cinfo.output_height);
  if (!out) {
    jpeg_destroy_decompress(&cinfo);
    return PP_NO_BUFFER;
  }
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW rows[4];
    unsigned n = 0;
    for (; n < 4 && cinfo.output_scanline + n < cinfo.output_height; n++)
      rows[n] = out + (size_t)(cinfo.output_scanline + n) * stride;
    jpeg_read_scanlines(&cinfo, rows, n);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return PP_OK;
}
