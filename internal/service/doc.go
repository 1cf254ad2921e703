// Package service is the gRPC edge of the daemons: PrefillService,
// DecodeService and AdminService. It validates every request (InvalidArgument
// naming the field, with a BadRequest detail; nothing changes on a refused
// request), maps the sentinel errors of the room owner to gRPC codes
// (NotFound, AlreadyExists, FailedPrecondition, ResourceExhausted,
// Unavailable while draining), and streams Watch with a bounded buffer that
// says how many transitions a slow reader missed.
//
// # Goroutines
//
// gRPC owns the handler goroutines; each Watch stream owns one goroutine
// (the handler) that drains its subscription. Room state, the data plane
// included, belongs to the room owner (package room); handlers only call
// it, and the service holds no map, mutex or goroutine per room and does
// not import package transfer (TestServiceDoesNotImportTransfer).
package service
