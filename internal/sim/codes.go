package sim

import (
	"strings"

	"google.golang.org/grpc/status"
)

func grpcCode(err error) string {
	return strings.ToLower(status.Code(err).String())
}
