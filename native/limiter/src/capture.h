/* capture.c: which streams may be capturing, and the library's own driver calls kept from disturbing them. */
#ifndef DRAGPU_CAPTURE_H
#define DRAGPU_CAPTURE_H

#include "common.h"

/* Captures open in the process (every way to begin one is wrapped): 0 means no stream can be capturing. */
extern _Atomic int dl_captures;
/* While a stream capture is open in the process, the library's own driver calls run with this thread's
 * capture mode relaxed, so that none of them can invalidate the application's capture. dl_capture_relax
 * returns what dl_capture_restore takes back (-1: nothing was changed: no capture open, or no such call). */
int dl_capture_relax(void);
void dl_capture_restore(int saved);
/* Whether a stream capture is open anywhere in the process. */
int dl_captures_open(void);
/* Whether the stream is capturing: 1 yes, 0 no, -1 cannot tell (cuStreamIsCapturing missing or failing).
 * cuStreamIsCapturing is the one question about a capturing stream that leaves its capture valid: a stream that
 * may be capturing must not be asked for its device or context, synchronised or queried. */
int dl_stream_capture_status(CUstream s, int ptsz);

#endif
