#!/usr/bin/env bash
# Makes the TLS material of a highly available Shardline (three coordinator
# replicas on a three-member etcd cluster): one private CA and, signed by it,
#
#   etcd-member.pem/.key   every etcd member's certificate, for clients
#                          (serverAuth) and for the other members (peer TLS
#                          is mutual: serverAuth and clientAuth)
#   etcd-client.pem/.key   the coordinators' client certificate to etcd
#                          (etcd runs with --client-cert-auth: no certificate
#                          signed by this CA, no access to the state)
#   coordinator.pem/.key   the replicas' gRPC server certificate (serverAuth)
#   ca.pem                 the CA: etcd's trusted CA, and what clients
#                          (workers, shardctl) check the coordinators with
#   ca.key                 the CA's key: keep it off the cluster
#
#   certs.sh OUT_DIR ETCD_NAMES COORDINATOR_NAMES [DAYS]
#
# ETCD_NAMES and COORDINATOR_NAMES are comma-separated host names or IPv4
# addresses, every name a client or peer uses to reach an etcd member or a
# replica (each goes into the certificate's subjectAltName; a name that is
# four dotted numbers becomes an IP entry). One certificate serves every
# member (and one every replica): simpler to rotate, but a member's key then
# also speaks for the others; use a certificate each where that matters.
# Keys are EC P-256, mode 0600, in OUT_DIR (created mode 0700); DAYS
# defaults to 365. Needs openssl. Example (deploy/k8s/README.md):
#
#   certs.sh ./tls \
#     shardline-etcd-0.shardline-etcd,shardline-etcd-1.shardline-etcd,shardline-etcd-2.shardline-etcd,localhost,127.0.0.1 \
#     shardline-coordinator-0.shardline-coordinator,shardline-coordinator-1.shardline-coordinator,shardline-coordinator-2.shardline-coordinator,localhost,127.0.0.1
set -euo pipefail

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//' >&2
  exit 2
}
if [ $# -lt 3 ] || [ $# -gt 4 ]; then usage; fi
out="$1" etcd_names="$2" coordinator_names="$3" days="${4:-365}"
[[ "$days" =~ ^[0-9]+$ ]] || { echo "certs.sh: DAYS must be a number of days, not '$days'" >&2; exit 2; }
command -v openssl >/dev/null || { echo "certs.sh: needs openssl" >&2; exit 1; }

# san NAMES: "DNS:a,IP:10.0.0.1,..." from a comma-separated list.
san() {
  local IFS=, name entries=()
  for name in $1; do
    [ -n "$name" ] || continue
    [[ "$name" =~ ^[A-Za-z0-9*._-]+$ ]] || { echo "certs.sh: '$name' is not a host name or IPv4 address" >&2; exit 2; }
    if [[ "$name" =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]]; then entries+=("IP:$name"); else entries+=("DNS:$name"); fi
  done
  [ ${#entries[@]} -gt 0 ] || { echo "certs.sh: an empty list of names" >&2; exit 2; }
  echo "${entries[*]}"
}
etcd_san=$(san "$etcd_names")
coordinator_san=$(san "$coordinator_names")

(umask 077 && mkdir -p "$out")
cd "$out"
umask 077
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

if [ ! -e ca.key ]; then
  key ca.key
  openssl req -x509 -new -key ca.key -sha256 -days "$days" -subj "/CN=shardline-ha-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out ca.pem
else
  echo "certs.sh: reusing $out/ca.key and ca.pem" >&2
fi

# leaf NAME CN EXTENDED_KEY_USAGE [SAN]
leaf() {
  local name="$1" cn="$2" eku="$3" alt="${4:-}"
  key "$name.key"
  openssl req -new -key "$name.key" -subj "/CN=$cn" -out "$name.csr"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$eku"
    [ -z "$alt" ] || echo "subjectAltName=$alt"
  } >"$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -sha256 \
    -days "$days" -extfile "$name.ext" -out "$name.pem" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
}
leaf etcd-member shardline-etcd serverAuth,clientAuth "$etcd_san"
leaf etcd-client shardline-coordinator clientAuth
leaf coordinator shardline-coordinator serverAuth "$coordinator_san"
rm -f ca.srl
chmod 0644 ca.pem etcd-member.pem etcd-client.pem coordinator.pem
echo "certs.sh: wrote $(pwd)/{ca,etcd-member,etcd-client,coordinator}.pem and their keys"
