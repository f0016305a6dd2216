package topspin

// Codec ids of CALL (§5.2).
const (
	CodecProto uint8 = 0
	CodecRaw   uint8 = 1
	CodecJSON  uint8 = 2
)

// CallOption configures one call.
type CallOption func(*callOptions)

type callOptions struct {
	codec    uint8
	header   *Metadata
	trailer  *Metadata
	compress string
}

// CallCompression sets the message compression of one call ("zstd", "gzip", or "identity"
// for none), overriding the connection's WithCompression (protocol.md §15).
func CallCompression(name string) CallOption { return func(o *callOptions) { o.compress = name } }

// WithCodec sets the codec byte of the call (CodecProto by default).
func WithCodec(id uint8) CallOption { return func(o *callOptions) { o.codec = id } }

// Header stores the response headers of the call in md.
func Header(md *Metadata) CallOption { return func(o *callOptions) { o.header = md } }

// Trailer stores the trailers of the call in md.
func Trailer(md *Metadata) CallOption { return func(o *callOptions) { o.trailer = md } }
