// pg_cpu.h - the cpu backend of pg.h: collectives between processes, on
// host memory, over TCP sockets and (between ranks of one host) shared memory.
//
// Included by pg.h, which dispatches to it; it needs only pg_types.h. It
// is built in four layers, each using only the one below it:
//   pg_cpu_stream.h      layer 1: byte streams (TCP, shared-memory rings)
//   pg_cpu_message.h     layer 2: messages with a checked header, single copy
//   pg_cpu_progress.h    layer 3: the progress engine, and posting work
//   pg_cpu_algorithms.h  layer 4: ring, recursive doubling, tree - the lesson
//   pg_cpu_setup.h       how the ranks connect (TCP, shared memory), create, destroy
//
//   1. Transports. To every other rank we hold a byte stream in each
//      direction: a TCP connection, or, when the peer runs on the same host,
//      a pair of ring buffers in shared memory (one copy in, one copy out,
//      no system call; written and read in 64 KiB chunks, so that the two
//      copies overlap). The TCP connection exists in both cases: it is how
//      the ranks meet, and the kernel closes it when a process dies, however
//      it dies - our only reliable sign that a peer is gone. Ranks of one
//      host that have a core each are bound to it, as mpirun binds them
//      (cpu_bind_to_cores in pg_cpu_setup.h says why).
//   2. Messages. Every send becomes a frame: a 24-byte header (a magic
//      number, which operation sent it, the payload size, and an address)
//      and the payload, padded to 8 bytes. The receiver checks that both
//      sides are in the same operation with the same size, instead of
//      silently mixing up bytes. Between ranks of one host, a payload of
//      512 KiB to 8 MiB travels as its address only: the receiver copies it
//      straight out of the sender's memory ("single copy", as MPI does).
//   3. The progress engine. isend/irecv only queue work. Bytes move when the
//      caller is inside a pg_ call (test, wait, or a blocking collective): one
//      loop that writes what it can to every peer and reads whatever has
//      arrived from every peer. A message that arrives before its receive
//      was posted waits in the stream ("parked") and flows into the
//      receive's buffer once it is posted; a rank that has been idle for a
//      millisecond takes such messages into buffers of its own, so two ranks
//      that both send first and receive second never deadlock, however large
//      the messages and however small the rings and the kernel's buffers.
//      A waiting rank spins, then yields its core, and sleeps only after a
//      tenth of a second (cpu_idle says why).
//      We chose this over a progress thread: no locks, every byte moves in
//      one visible loop. The price is that an isend does not advance while
//      the caller computes (as in MPI without an asynchronous progress
//      thread); pg_isend does push the message out at once when the link is
//      idle, so small messages usually leave immediately.
//   4. Algorithms: the collectives, written with isend/irecv/wait. Large
//      all-reduces use a ring (reduce-scatter then all-gather), small ones
//      recursive doubling; each is explained where it is defined.
//
// Waiting never lasts forever: when nothing has moved for the group's
// timeout, or a peer we wait for has closed its connection, the process
// stops with a message that names the operation and the peer.
#ifndef COURSE_PG_CPU_H
#define COURSE_PG_CPU_H

#include "pg_cpu_progress.h"
#include "pg_cpu_algorithms.h"
#include "pg_cpu_setup.h"

#endif
