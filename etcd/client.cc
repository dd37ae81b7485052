// etcd v3 client: one gRPC channel per endpoint, synchronous calls, and the
// endpoint failover etcd/client.h describes.
//
// Every call but Status and a serializable Range (a member-local read,
// which needs no leader) carries etcd's "hasleader: true" metadata, so a
// member that has lost its raft leader refuses at once with "etcdserver: no
// leader" (UNAVAILABLE) instead of holding the request until it times out;
// etcd refuses such a request in its gRPC interceptor, before the request
// reaches raft, so moving on to the next endpoint is safe even for a Txn.
//
// Keep-alives: each LeaseKeepAliveOnce opens a LeaseKeepAlive stream on the
// current endpoint's channel (the HTTP/2 connection is shared), sends one
// request, reads one answer and closes it. That bounds every keep-alive by
// the call's deadline (a synchronous stream kept open could not time out a
// read) and needs no thread; a stream costs a few hundred bytes on an
// already open connection, and keep-alives come every few hundred ms.
#include "etcd/client.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <functional>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/text.h"
#include "common/tls_files.h"
#include "etcd/url.h"
#include "etcd/v3/rpc.grpc.pb.h"

namespace shardline::etcd {
namespace {

using etcdserverpb::KV;
using etcdserverpb::Lease;
using etcdserverpb::Maintenance;

// etcd's refusals that mean "not this member, not now" and were answered
// before the request reached raft: no leader, or its leader changed under
// a linearizable read.
bool IsNoLeader(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE &&
         (absl::StrContains(s.error_message(), "etcdserver: no leader") ||
          absl::StrContains(s.error_message(), "etcdserver: leader changed"));
}

// gRPC's UNAVAILABLE text for a failed connect is long ("failed to connect
// to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:2379: Failed to
// connect to remote host: Connection refused"); the reason is the end.
std::string ShortReason(const grpc::Status& s) {
  const std::string lower = absl::AsciiStrToLower(s.error_message());
  if (absl::StrContains(lower, "connection refused")) return "connection refused";
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) return "deadline exceeded";
  if (s.error_message().empty()) {
    return absl::StrCat("gRPC ",
                        absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code())));
  }
  return AbbreviateValue(s.error_message(), 300);
}

std::string DurationText(absl::Duration d) { return absl::FormatDuration(d); }

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeEtcdCredentials(
    const std::string& ca_file, const std::string& cert_file, const std::string& key_file) {
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(cert_file.empty() ? "--etcd-key" : "--etcd-cert", " is set without ",
                     cert_file.empty() ? "--etcd-cert" : "--etcd-key",
                     "; give both (a client certificate and its key) or neither"));
  }
  grpc::SslCredentialsOptions ssl;
  if (!ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadPemFile(ca_file, "--etcd-ca", PemKind::kCertificates);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
  }
  if (!cert_file.empty()) {
    absl::StatusOr<std::string> cert =
        ReadPemFile(cert_file, "--etcd-cert", PemKind::kCertificates);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPemFile(key_file, "--etcd-key", PemKind::kPrivateKey);
    if (!key.ok()) return key.status();
    if (absl::Status s =
            CheckKeyMatchesCertificate(*cert, absl::StrCat("--etcd-cert file '", cert_file, "'"),
                                       *key, absl::StrCat("--etcd-key file '", key_file, "'"));
        !s.ok()) {
      return s;
    }
    ssl.pem_cert_chain = *cert;
    ssl.pem_private_key = *key;
  }
  return grpc::SslCredentials(ssl);
}

std::string PrefixRangeEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    unsigned char last = static_cast<unsigned char>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  // Empty, or only 0xff bytes: every key from `prefix` on.
  return std::string(1, '\0');
}

class Client::Impl {
 public:
  struct Endpoint {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<KV::Stub> kv;
    std::unique_ptr<Lease::Stub> lease;
    std::unique_ptr<Maintenance::Stub> maintenance;
  };

  explicit Impl(const ClientOptions& options) : timeout_(options.timeout) {
    std::shared_ptr<grpc::ChannelCredentials> credentials =
        options.credentials != nullptr ? options.credentials : grpc::InsecureChannelCredentials();
    for (const std::string& address : options.endpoints) {
      grpc::ChannelArguments args;
      // Range pages and Txn answers can exceed gRPC's 4 MiB default.
      args.SetMaxReceiveMessageSize(INT_MAX);
      args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
      // A member back from a restart is used again within a second, not
      // after gRPC's default backoff (1 s growing to 120 s).
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
      // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS (gRPC's connect timeout, 20 s) is
      // left alone: set, even to 2 s, connects to etcd failed ("tcp
      // handshaker shutdown") while a member was starting. A connect made
      // while a restarting member has bound its port but not yet rejoined
      // the cluster gets no HTTP/2 SETTINGS until it has; the equal share
      // of each call's time (Run) sends the call on to the next member
      // meanwhile.
      // Its own connection per endpoint, even for equal targets.
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      auto e = std::make_unique<Endpoint>();
      e->address = address;
      e->channel = grpc::CreateCustomChannel(address, credentials, args);
      e->kv = KV::NewStub(e->channel);
      e->lease = Lease::NewStub(e->channel);
      e->maintenance = Maintenance::NewStub(e->channel);
      endpoints_.push_back(std::move(e));
    }
  }

  size_t size() const { return endpoints_.size(); }
  Endpoint& endpoint(size_t i) { return *endpoints_[i]; }
  absl::Duration timeout() const { return timeout_; }

  // Runs `attempt` on the current endpoint, then on the next ones while an
  // attempt says kNextEndpoint, each endpoint at most once, all before the
  // deadline. `idempotent`: a transport failure after the request may have
  // been sent moves on too; otherwise only a member that was never
  // connected (the request cannot have left this process) or that refused
  // for want of a leader is passed over.
  using Attempt = std::function<grpc::Status(Endpoint&, grpc::ClientContext&)>;
  absl::Status Run(absl::string_view method, bool idempotent, const Attempt& attempt,
                   bool require_leader = true) {
    const absl::Time start = absl::Now();
    const absl::Time deadline = start + timeout_;
    const size_t n = endpoints_.size();
    const size_t first = current_.load();
    std::vector<std::string> errors;
    bool timed_out = false;
    for (size_t i = 0; i < n; ++i) {
      const size_t index = (first + i) % n;
      Endpoint& e = *endpoints_[index];
      const absl::Time now = absl::Now();
      if (now >= deadline) {
        timed_out = true;
        break;
      }
      // Each endpoint left gets an equal share of the time left, so one
      // member that accepts connections but does not answer (paused,
      // overloaded) leaves time for the others; the last gets the rest.
      const absl::Time attempt_deadline = now + (deadline - now) / static_cast<int64_t>(n - i);
      if (!idempotent && !WaitConnected(e, attempt_deadline)) {
        errors.push_back(absl::StrCat(e.address, ": not connected (",
                                      ChannelStateText(e.channel->GetState(false)), ")"));
        Advance(index);
        continue;
      }
      grpc::ClientContext context;
      // A write, once sent, has the whole time: it is not tried elsewhere.
      context.set_deadline(absl::ToChronoTime(idempotent ? attempt_deadline : deadline));
      if (require_leader) context.AddMetadata("hasleader", "true");
      const grpc::Status s = attempt(e, context);
      if (s.ok()) {
        current_.store(index);
        return absl::OkStatus();
      }
      const bool no_leader = IsNoLeader(s);
      // UNAVAILABLE: the transport, or etcd's own "request timed out",
      // "too many requests"; a repeatable call tries the next member.
      const bool unavailable = s.error_code() == grpc::StatusCode::UNAVAILABLE;
      const bool transport =
          unavailable && !no_leader && !absl::StartsWith(s.error_message(), "etcdserver:");
      // Our deadline, seen by gRPC or by etcd (which stops a request when
      // the client's deadline passes and answers UNKNOWN "context deadline
      // exceeded").
      const bool attempt_timed_out =
          s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
          absl::StrContains(s.error_message(), "context deadline exceeded");
      if (no_leader || (idempotent && (unavailable || attempt_timed_out))) {
        errors.push_back(absl::StrCat(e.address, ": ", ShortReason(s)));
        if (attempt_timed_out && absl::Now() >= deadline) timed_out = true;
        Advance(index);
        continue;
      }
      // An answer etcd means (or an ambiguous failure of a write): no
      // other member would answer differently.
      errors.push_back(absl::StrCat(e.address, ": ", ShortReason(s)));
      const absl::StatusCode code = attempt_timed_out
                                        ? absl::StatusCode::kDeadlineExceeded
                                        : static_cast<absl::StatusCode>(s.error_code());
      if (transport) Advance(index);
      return absl::Status(code,
                          absl::StrCat("etcd at ", absl::StrJoin(errors, "; "), " (", method, ")"));
    }
    if (timed_out || absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("etcd ", method, " did not complete within ", DurationText(timeout_),
                       errors.empty() ? "" : ": ", absl::StrJoin(errors, "; ")));
    }
    return absl::UnavailableError(
        absl::StrCat("etcd at ", absl::StrJoin(errors, "; "), " (", method,
                     "; no member answered: check that etcd is running and has a quorum)"));
  }

 private:
  // The next endpoint becomes current unless another call moved it already.
  void Advance(size_t failed) {
    size_t expected = failed;
    current_.compare_exchange_strong(expected, (failed + 1) % endpoints_.size());
  }

  static const char* ChannelStateText(grpc_connectivity_state state) {
    switch (state) {
      case GRPC_CHANNEL_IDLE:
        return "idle";
      case GRPC_CHANNEL_CONNECTING:
        return "still connecting";
      case GRPC_CHANNEL_READY:
        return "ready";
      case GRPC_CHANNEL_TRANSIENT_FAILURE:
        return "connection failed: the member is down or unreachable";
      case GRPC_CHANNEL_SHUTDOWN:
        return "shut down";
    }
    return "unknown";
  }

  // Whether the channel is connected by `deadline`; false at once when
  // its last connect failed (gRPC would fail a call there without sending).
  static bool WaitConnected(Endpoint& e, absl::Time deadline) {
    grpc_connectivity_state state = e.channel->GetState(/*try_to_connect=*/true);
    while (state != GRPC_CHANNEL_READY) {
      if (state == GRPC_CHANNEL_TRANSIENT_FAILURE || state == GRPC_CHANNEL_SHUTDOWN) return false;
      if (!e.channel->WaitForStateChange(state, absl::ToChronoTime(deadline))) return false;
      state = e.channel->GetState(/*try_to_connect=*/true);
    }
    return true;
  }

  const absl::Duration timeout_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  std::atomic<size_t> current_{0};
};

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError(
        "etcd client: no endpoints; give at least one HOST:PORT of an etcd member");
  }
  for (size_t i = 0; i < options.endpoints.size(); ++i) {
    if (absl::Status s = CheckEndpoint(options.endpoints[i], absl::StrCat("etcd endpoint ", i + 1));
        !s.ok()) {
      return s;
    }
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd client: timeout ", DurationText(options.timeout), " is not positive"));
  }
  auto impl = std::make_unique<Impl>(options);
  return std::unique_ptr<Client>(new Client(std::move(options), std::move(impl)));
}

Client::Client(ClientOptions options, std::unique_ptr<Impl> impl)
    : options_(std::move(options)), impl_(std::move(impl)) {}

Client::~Client() = default;

absl::StatusOr<etcdserverpb::RangeResponse> Client::Range(
    const etcdserverpb::RangeRequest& request) {
  etcdserverpb::RangeResponse response;
  absl::Status s = impl_->Run(
      "Range", /*idempotent=*/true,
      [&](Impl::Endpoint& e, grpc::ClientContext& context) {
        response.Clear();
        return e.kv->Range(&context, request, &response);
      },
      /*require_leader=*/!request.serializable());
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<std::vector<etcdserverpb::KeyValue>> Client::RangePrefix(const std::string& prefix,
                                                                        int64_t* revision,
                                                                        int64_t page) {
  if (page <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd RangePrefix: page ", page, " is not positive"));
  }
  std::vector<etcdserverpb::KeyValue> out;
  etcdserverpb::RangeRequest request;
  request.set_key(prefix);
  request.set_range_end(PrefixRangeEnd(prefix));
  request.set_limit(page);
  int64_t at = 0;
  while (true) {
    request.set_revision(at);
    absl::StatusOr<etcdserverpb::RangeResponse> r = Range(request);
    if (!r.ok()) return r.status();
    if (at == 0) at = r->header().revision();
    for (etcdserverpb::KeyValue& kv : *r->mutable_kvs()) out.push_back(std::move(kv));
    if (!r->more() || r->kvs_size() == 0) break;
    // The next page starts just after the last key of this one.
    request.set_key(out.back().key() + std::string(1, '\0'));
  }
  if (revision != nullptr) *revision = at;
  return out;
}

absl::StatusOr<etcdserverpb::TxnResponse> Client::Txn(const etcdserverpb::TxnRequest& request) {
  etcdserverpb::TxnResponse response;
  absl::Status s =
      impl_->Run("Txn", /*idempotent=*/false, [&](Impl::Endpoint& e, grpc::ClientContext& context) {
        response.Clear();
        return e.kv->Txn(&context, request, &response);
      });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<int64_t> Client::LeaseGrant(absl::Duration ttl) {
  if (ttl <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd LeaseGrant: ttl ", DurationText(ttl), " is not positive"));
  }
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1)))));
  etcdserverpb::LeaseGrantResponse response;
  absl::Status s = impl_->Run("LeaseGrant", /*idempotent=*/false,
                              [&](Impl::Endpoint& e, grpc::ClientContext& context) {
                                response.Clear();
                                return e.lease->LeaseGrant(&context, request, &response);
                              });
  if (!s.ok()) return s;
  if (!response.error().empty()) {
    return absl::UnavailableError(
        absl::StrCat("etcd LeaseGrant refused: ", AbbreviateValue(response.error(), 300)));
  }
  return response.id();
}

absl::StatusOr<absl::Duration> Client::LeaseKeepAliveOnce(int64_t id) {
  etcdserverpb::LeaseKeepAliveResponse response;
  absl::Status s = impl_->Run(
      "LeaseKeepAlive", /*idempotent=*/true, [&](Impl::Endpoint& e, grpc::ClientContext& context) {
        response.Clear();
        std::unique_ptr<grpc::ClientReaderWriter<etcdserverpb::LeaseKeepAliveRequest,
                                                 etcdserverpb::LeaseKeepAliveResponse>>
            stream = e.lease->LeaseKeepAlive(&context);
        etcdserverpb::LeaseKeepAliveRequest request;
        request.set_id(id);
        const bool sent = stream->Write(request);
        const bool read = sent && stream->Read(&response);
        if (read) {
          // Our one answer came; the rest is closing the stream, and its
          // status (CANCELLED) says nothing about the keep-alive.
          context.TryCancel();
          stream->Finish().IgnoreError();
          return grpc::Status::OK;
        }
        stream->WritesDone();
        grpc::Status finish = stream->Finish();
        if (finish.ok()) {
          return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                              "the keep-alive stream closed without an answer");
        }
        return finish;
      });
  if (!s.ok()) return s;
  if (response.ttl() <= 0) {
    return absl::NotFoundError(
        absl::StrCat("etcd lease ", id, " does not exist (it expired or was revoked)"));
  }
  return absl::Seconds(response.ttl());
}

absl::StatusOr<absl::Duration> Client::LeaseTimeToLive(int64_t id) {
  etcdserverpb::LeaseTimeToLiveRequest request;
  request.set_id(id);
  etcdserverpb::LeaseTimeToLiveResponse response;
  absl::Status s = impl_->Run("LeaseTimeToLive", /*idempotent=*/true,
                              [&](Impl::Endpoint& e, grpc::ClientContext& context) {
                                response.Clear();
                                return e.lease->LeaseTimeToLive(&context, request, &response);
                              });
  if (absl::IsNotFound(s) || (s.ok() && response.ttl() < 0)) {
    return absl::NotFoundError(
        absl::StrCat("etcd lease ", id, " does not exist (it expired or was revoked)"));
  }
  if (!s.ok()) return s;
  return absl::Seconds(response.ttl());
}

absl::Status Client::LeaseRevoke(int64_t id) {
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(id);
  etcdserverpb::LeaseRevokeResponse response;
  absl::Status s = impl_->Run("LeaseRevoke", /*idempotent=*/true,
                              [&](Impl::Endpoint& e, grpc::ClientContext& context) {
                                return e.lease->LeaseRevoke(&context, request, &response);
                              });
  // "etcdserver: requested lease not found": already gone, which is what
  // revoking asks for.
  if (absl::IsNotFound(s)) return absl::OkStatus();
  return s;
}

std::vector<MemberStatus> Client::Status(absl::Duration timeout) {
  std::vector<MemberStatus> out(impl_->size());
  std::vector<std::thread> threads;
  threads.reserve(impl_->size());
  for (size_t i = 0; i < impl_->size(); ++i) {
    threads.emplace_back([this, i, timeout, &out] {
      Impl::Endpoint& e = impl_->endpoint(i);
      MemberStatus& m = out[i];
      m.endpoint = e.address;
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
      etcdserverpb::StatusRequest request;
      etcdserverpb::StatusResponse response;
      const grpc::Status s = e.maintenance->Status(&context, request, &response);
      if (!s.ok()) {
        m.status =
            absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                         absl::StrCat("etcd at ", e.address, ": ", ShortReason(s), " (Status)"));
        return;
      }
      m.status = absl::OkStatus();
      m.version = response.version();
      m.db_size_bytes = response.dbsize();
      m.member_id = response.header().member_id();
      m.leader_id = response.leader();
      m.raft_term = response.raftterm();
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

}  // namespace shardline::etcd
