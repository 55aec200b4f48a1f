// pingpong.c - reference solution of exercise 02/pingpong.
#include "exercises.h"

void pingpong(pg_t *pg, int32_t *buf, size_t count, int iters) {
    int rank = pg_rank(pg);
    for (int i = 0; i < iters; i++) {
        if (rank == 0) {
            pg_send(pg, buf, count, DTYPE_I32, 1);
            pg_recv(pg, buf, count, DTYPE_I32, 1);
        } else if (rank == 1) {
            pg_recv(pg, buf, count, DTYPE_I32, 0);
            for (size_t j = 0; j < count; j++) buf[j] += 1;
            pg_send(pg, buf, count, DTYPE_I32, 0);
        }
    }
}
