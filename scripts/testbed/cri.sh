# shellcheck shell=bash
# A CRI client small enough for a shell script: gRPC is HTTP/2 with a 5-byte frame header, so
# curl (--http2-prior-knowledge over the unix socket) can make real CRI calls, and the few
# request messages the test bed needs are easy to encode by hand. Messages are carried as hex
# strings because shell variables cannot hold NUL bytes.
# Sourced by scripts/testbed.sh and scripts/testbed/selftest.sh; expects CRI_SOCKET to be set.

# Varint encoding of a non-negative integer, as hex.
pb_varint() {
  local v=$1 out=""
  while ((v >= 128)); do
    out+=$(printf %02x $(((v & 127) | 128)))
    v=$((v >> 7))
  done
  printf %s%02x "$out" "$v"
}

# Length-delimited field (string, bytes, embedded message) whose payload is given as hex.
pb_msg() { printf %s%s%s "$(pb_varint $((($1 << 3) | 2)))" "$(pb_varint $((${#2} / 2)))" "$2"; }
pb_str() { pb_msg "$1" "$(printf %s "$2" | od -An -v -tx1 | tr -d ' \n')"; }
pb_int() { printf %s%s "$(pb_varint $(($1 << 3)))" "$(pb_varint "$2")"; }

# Hex string -> bytes on stdout.
hex_to_bytes() {
  local hex=$1 i
  for ((i = 0; i < ${#hex}; i += 2048)); do
    # shellcheck disable=SC2059 # the format is built from hex digits only
    printf "$(printf %s "${hex:i:2048}" | sed 's/../\\x&/g')"
  done
}

# pb_get HEX FIELD: the first occurrence of FIELD in the message. Prints the payload as hex for
# length-delimited fields and as a decimal number for varints (int64 negatives come out as
# their 64-bit unsigned value). Returns 1 if the field is absent.
pb_get() {
  local hex=$1 want=$2 pos=0 n=${#1} key wire field shift byte value len
  while ((pos < n)); do
    key=0 shift=0
    while :; do
      byte=$((16#${hex:pos:2})); pos=$((pos + 2))
      key=$((key | ((byte & 127) << shift))); shift=$((shift + 7))
      ((byte & 128)) || break
    done
    wire=$((key & 7)) field=$((key >> 3))
    case $wire in
      0)
        value=0 shift=0
        while :; do
          byte=$((16#${hex:pos:2})); pos=$((pos + 2))
          value=$((value | ((byte & 127) << shift))); shift=$((shift + 7))
          ((byte & 128)) || break
        done
        if ((field == want)); then printf '%u\n' "$value"; return 0; fi ;;
      1) ((field == want)) && { printf %s "${hex:pos:16}"; return 0; }; pos=$((pos + 16)) ;;
      5) ((field == want)) && { printf %s "${hex:pos:8}"; return 0; }; pos=$((pos + 8)) ;;
      2)
        len=0 shift=0
        while :; do
          byte=$((16#${hex:pos:2})); pos=$((pos + 2))
          len=$((len | ((byte & 127) << shift))); shift=$((shift + 7))
          ((byte & 128)) || break
        done
        if ((field == want)); then printf %s "${hex:pos:len*2}"; return 0; fi
        pos=$((pos + len * 2)) ;;
      *) return 1 ;;
    esac
  done
  return 1
}

# cri_call SERVICE METHOD REQUEST_HEX [TIMEOUT_S]: prints the response message as hex on success.
# On failure prints "METHOD: grpc-status N: message" on stderr and returns 1. Never hangs: curl
# has a deadline.
cri_call() {
  local tmp rc=0
  tmp=$(mktemp -d)
  _cri_call "$tmp" "$@" || rc=$?
  rm -rf "$tmp"
  return "$rc"
}

_cri_call() {
  local tmp=$1 service=$2 method=$3 req=$4 timeout=${5:-10} status msg body
  hex_to_bytes "00$(printf %08x $((${#req} / 2)))$req" >"$tmp/req" || return 1
  if ! curl -sS --http2-prior-knowledge --unix-socket "$CRI_SOCKET" --max-time "$timeout" \
      -X POST -H 'content-type: application/grpc' -H 'te: trailers' \
      --data-binary @"$tmp/req" -D "$tmp/headers" -o "$tmp/body" \
      "http://localhost/runtime.v1.$service/$method" 2>"$tmp/err"; then
    echo "$method: $(tr -d '\r' <"$tmp/err")" >&2
    return 1
  fi
  # grpc-status arrives as a trailer, or as a header in a trailers-only error response.
  status=$(tr -d '\r' <"$tmp/headers" | sed -n 's/^grpc-status: *//Ip' | tail -n1)
  if [ "$status" != 0 ]; then
    msg=$(tr -d '\r' <"$tmp/headers" | sed -n 's/^grpc-message: *//Ip' | tail -n1)
    echo "$method: grpc-status ${status:-missing}: ${msg:-no message}" >&2
    return 1
  fi
  body=$(od -An -v -tx1 "$tmp/body" | tr -d ' \n')
  printf %s "${body:10}"
}
