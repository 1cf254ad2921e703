"""The generated pdlink.v1 API (protoc output; make proto regenerates it)."""
