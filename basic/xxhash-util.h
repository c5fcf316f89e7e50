/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

#include <xxhash.h>

/* On x86, libxxhash can pick the widest vector unit of the CPU at run time
 * (AVX2 or AVX-512) for XXH3; its plain entry points use the SSE2 code it
 * was compiled with, a quarter of the speed on a CPU with AVX-512. The
 * header renames the XXH3 calls to those that choose; same hashes. */
#if HAVE_XXH_X86DISPATCH
#  include <xxh_x86dispatch.h>
#endif
