package zmtp

const crashChildEnv = "ZMTP_CRASH_CHILD"

func runCrashChild(mode string) {}
