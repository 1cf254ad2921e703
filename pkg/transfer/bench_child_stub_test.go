package transfer

const benchChildEnv = "PDLINK_TRANSFER_BENCH_CHILD"

func benchReceiverChild() int { return 0 }
