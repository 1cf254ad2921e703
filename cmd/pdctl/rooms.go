package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/poll"
)

func dial(addr string) (*grpc.ClientConn, error) {
	target := addr
	if !strings.HasPrefix(addr, "unix://") {
		target = "passthrough:///" + addr
	}
	return grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// parseState reads --state with the daemons' one parser (poll.ParseState),
// so what pdctl prints, the metric label and the gRPC name all work.
func parseState(s string) (pb.RoomState, error) {
	if s == "" {
		return pb.RoomState_ROOM_STATE_UNSPECIFIED, nil
	}
	st, err := poll.ParseState(s)
	if err != nil {
		return 0, err
	}
	return pb.RoomState(pb.RoomState_value["ROOM_STATE_"+strings.ToUpper(poll.SnakeStateName(st))]), nil
}

func stateName(s pb.RoomState) string {
	if s == pb.RoomState_ROOM_STATE_UNSPECIFIED {
		return "(open)"
	}
	return strings.ToLower(strings.TrimPrefix(s.String(), "ROOM_STATE_"))
}

func newRoomsCommand() *cobra.Command {
	var addr, state, peer string
	var minAge time.Duration
	var limit int
	cmd := &cobra.Command{
		Use:   "rooms",
		Short: "list a daemon's rooms (state, age, deadline, peer, reason)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := parseState(state)
			if err != nil {
				return err
			}
			conn, err := dial(addr)
			if err != nil {
				return err
			}
			defer conn.Close()
			client := pb.NewAdminServiceClient(conn)
			req := &pb.ListRoomsRequest{State: st, Peer: peer, PageSize: 1000}
			if minAge > 0 {
				req.MinAge = durationpb.New(minAge)
			}
			var rooms []*pb.RoomInfo
			for {
				ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
				resp, err := client.ListRooms(ctx, req)
				cancel()
				if err != nil {
					return err
				}
				rooms = append(rooms, resp.Rooms...)
				if resp.NextPageToken == "" || (limit > 0 && len(rooms) >= limit) {
					break
				}
				req.PageToken = resp.NextPageToken
			}
			if limit > 0 && len(rooms) > limit {
				rooms = rooms[:limit]
			}
			printRooms(cmd.OutOrStdout(), rooms, time.Now())
			return nil
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "unix:///run/pdlink/decoded.sock", "daemon gRPC address: unix:///path or host:port")
	cmd.Flags().StringVar(&state, "state", "", "only rooms in this state")
	cmd.Flags().DurationVar(&minAge, "min-age", 0, "only rooms at least this old")
	cmd.Flags().StringVar(&peer, "peer", "", "only rooms bound to this peer")
	cmd.Flags().IntVar(&limit, "limit", 0, "at most this many rooms (0: all)")
	return cmd
}

func printRooms(out io.Writer, rooms []*pb.RoomInfo, now time.Time) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ROOM\tNONCE\tSTATE\tAGE\tIN STATE\tDEADLINE IN\tPEER\tREASON")
	for _, r := range rooms {
		deadline := "-"
		if r.Deadline != nil {
			deadline = r.Deadline.AsTime().Sub(now).Round(time.Millisecond).String()
		}
		fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.RoomId, r.Nonce, stateName(r.State),
			r.Age.AsDuration().Round(time.Millisecond), r.StateAge.AsDuration().Round(time.Millisecond),
			deadline, dash(r.Peer), dash(r.Reason))
	}
	w.Flush()
	fmt.Fprintf(out, "%d rooms\n", len(rooms))
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newWatchCommand() *cobra.Command {
	var addr string
	var states []string
	var duration time.Duration
	cmd := &cobra.Command{
		Use:   "watch",
		Short: "stream a daemon's room transitions as they happen",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			filter := &pb.WatchFilter{}
			for _, s := range states {
				st, err := parseState(s)
				if err != nil {
					return err
				}
				filter.ToStates = append(filter.ToStates, st)
			}
			conn, err := dial(addr)
			if err != nil {
				return err
			}
			defer conn.Close()
			ctx := cmd.Context()
			if duration > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, duration)
				defer cancel()
			}
			recv, err := openWatch(ctx, conn, filter)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(cmd.ErrOrStderr(), "watching %s\n", addr)
			for {
				ev, err := recv()
				if err != nil {
					if errors.Is(err, io.EOF) || status.Code(err) == codes.DeadlineExceeded || status.Code(err) == codes.Canceled || ctx.Err() != nil {
						return nil
					}
					return err
				}
				switch e := ev.Event.(type) {
				case *pb.WatchEvent_Transition:
					tr := e.Transition
					fmt.Fprintf(out, "%s room=%d nonce=%d %s -> %s %s\n", tr.At.AsTime().Format(time.RFC3339Nano),
						tr.RoomId, tr.Nonce, stateName(tr.From), stateName(tr.To), tr.Reason)
				case *pb.WatchEvent_Missed:
					fmt.Fprintf(out, "missed %d transitions (slow reader): re-sync with pdctl rooms\n", e.Missed)
				}
			}
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "unix:///run/pdlink/decoded.sock", "daemon gRPC address: unix:///path or host:port")
	cmd.Flags().StringSliceVar(&states, "state", nil, "only transitions into these states")
	cmd.Flags().DurationVar(&duration, "for", 0, "stop after this long (0: until interrupted)")
	return cmd
}

// openWatch asks the prefill service first and falls back to the decode
// service, so one command serves both daemons. The stream's header says
// the daemon subscribed; an Unimplemented status there means the other
// daemon.
func openWatch(ctx context.Context, conn *grpc.ClientConn, filter *pb.WatchFilter) (func() (*pb.WatchEvent, error), error) {
	pctx, cancel := context.WithCancel(ctx)
	ps, err := pb.NewPrefillServiceClient(conn).Watch(pctx, &pb.PrefillServiceWatchRequest{Filter: filter})
	if err == nil {
		var md metadata.MD
		if md, err = ps.Header(); err == nil && md == nil {
			// Trailers only: the stream ended at once; Recv has the status.
			_, err = ps.Recv()
		}
		if err == nil {
			return func() (*pb.WatchEvent, error) {
				m, err := ps.Recv()
				if err != nil {
					cancel()
					return nil, err
				}
				return m.Event, nil
			}, nil
		}
	}
	cancel()
	if status.Code(err) != codes.Unimplemented {
		return nil, err
	}
	ds, err := pb.NewDecodeServiceClient(conn).Watch(ctx, &pb.DecodeServiceWatchRequest{Filter: filter})
	if err != nil {
		return nil, err
	}
	if md, err := ds.Header(); err != nil || md == nil {
		if err == nil {
			_, err = ds.Recv()
		}
		return nil, err
	}
	return func() (*pb.WatchEvent, error) {
		m, err := ds.Recv()
		if err != nil {
			return nil, err
		}
		return m.Event, nil
	}, nil
}
