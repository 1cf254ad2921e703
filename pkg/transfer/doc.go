// Package transfer is pdlink's KV data plane: memory regions shared with the engine, and the
// transport that moves a room's pages from a prefill region into a decode region.
package transfer
