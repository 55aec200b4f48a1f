// store.h - a small TCP key-value store for start-up, and rendezvous.
//
// Before ranks can talk to each other they must find each other. NCCL's
// ranks need the same 128-byte unique id, the cpu backend's ranks need each
// other's listening addresses, and everyone needs to know when all have
// arrived. torch.distributed solves this with TCPStore: rank 0 (or the
// launcher) serves a key-value table on MASTER_ADDR:MASTER_PORT, and every
// rank connects as a client that can
//   set   a key,
//   get   a key, waiting until some other rank has set it,
//   add   to a counter atomically (how a barrier counts arrivals),
//   check whether a key exists, or wait for it.
// The same idea in plain C, in five headers, each read in one sitting:
//   store_wire.h      what goes over the socket: frames, operations, limits
//   store_requests.h  the server's table of keys and its answer to each
//                     request (the hello checks the job's token)
//   store_server.h    the server: one thread, a poll() loop over the clients
//   store_client.h    the client: set/get/add/..., a barrier, broadcast,
//                     all-gather and vote
//   rendezvous.h      rendezvous() for the env://, tcp:// and file:// init methods
// This header includes them all, for programs that use every part (the
// launcher, the tests); a header that needs only one part includes that one.
#ifndef COURSE_STORE_H
#define COURSE_STORE_H

#include "store_wire.h"
#include "store_server.h"
#include "store_client.h"
#include "rendezvous.h"

#endif
