"""shardline.Connection's TLS options against the real coordinator serving TLS.

Certificates are made here with openssl: a CA, a server certificate for the
name "coordinator.test" only (no IP address: tls_server_name must name it),
a client certificate. One coordinator serves TLS (--tls-cert/--tls-key),
another requires client certificates too (--tls-client-ca).
"""

import os
import shutil
import subprocess
import tempfile
import unittest

import shardline

from coordinator import Coordinator

SERVER_NAME = "coordinator.test"


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certificates(d):
    """ca.pem/ca.key, server.pem/server.key (SAN DNS:coordinator.test), client.pem/client.key."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
             "-days", "2", "-subj", "/CN=shardline test CA", cwd=d)
    for name, ext in (("server", "subjectAltName=DNS:%s\nextendedKeyUsage=serverAuth" % SERVER_NAME),
                      ("client", "extendedKeyUsage=clientAuth")):
        with open(os.path.join(d, name + ".ext"), "w") as f:
            f.write(ext + "\n")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", name + ".key", "-out",
                 name + ".csr", "-subj", "/CN=%s" % (SERVER_NAME if name == "server" else "client"),
                 cwd=d)
        _openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", name + ".pem", "-days", "2", "-extfile", name + ".ext",
                 cwd=d)
    for key in ("ca.key", "server.key", "client.key"):
        os.chmod(os.path.join(d, key), 0o600)


class TlsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        make_certificates(cls.dir)
        p = lambda name: os.path.join(cls.dir, name)  # noqa: E731
        cls.ca, cls.cert, cls.key = p("ca.pem"), p("client.pem"), p("client.key")
        server = ["--tls-cert", p("server.pem"), "--tls-key", p("server.key")]
        cls.tls = Coordinator(args=server).start()
        cls.mtls = Coordinator(args=server + ["--tls-client-ca", p("ca.pem")]).start()

    @classmethod
    def tearDownClass(cls):
        cls.tls.stop()
        cls.mtls.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_tls_with_the_server_name(self):
        with shardline.Client(self.tls.address, tls_ca=self.ca,
                              tls_server_name=SERVER_NAME) as client:
            self.assertEqual(client.status().state, "memory")
            self.assertEqual(client.list_jobs(), [])
            with self.assertRaises(shardline.NotFoundError):
                client.get_job("none")

    def test_certificate_for_another_name_fails_the_handshake(self):
        # 127.0.0.1 is not in the certificate.
        with shardline.Client(self.tls.address, tls_ca=self.ca, timeout=3) as client:
            with self.assertRaises(shardline.UnavailableError) as cm:
                client.status()
        self.assertIn("cannot reach the coordinator at %s: TLS handshake failed" % self.tls.address,
                      cm.exception.message)
        self.assertIn("not in peer certificate", cm.exception.message)
        self.assertIn("tls_server_name", cm.exception.message)

    def test_plaintext_to_a_tls_coordinator_fails(self):
        with shardline.Client(self.tls.address, timeout=3) as client:
            with self.assertRaises(shardline.UnavailableError) as cm:
                client.status()
        self.assertIn("cannot reach the coordinator at %s: the connection was closed (if the "
                      "coordinator serves TLS, pass tls_ca)" % self.tls.address, cm.exception.message)

    def test_mutual_tls(self):
        with shardline.Client(self.mtls.address, tls_ca=self.ca, tls_cert=self.cert,
                              tls_key=self.key, tls_server_name=SERVER_NAME) as client:
            self.assertEqual(client.status().state, "memory")
        with shardline.Client(self.mtls.address, tls_ca=self.ca, tls_server_name=SERVER_NAME,
                              timeout=3) as client:
            with self.assertRaises(shardline.UnavailableError) as cm:
                client.status()
        self.assertIn("the connection was closed", cm.exception.message)

    def test_key_of_another_certificate_is_refused(self):
        with self.assertRaises(ValueError) as cm:
            shardline.Client(self.mtls.address, tls_ca=self.ca, tls_cert=self.cert,
                             tls_key=os.path.join(self.dir, "server.key"))
        self.assertIn("tls_key", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            shardline.Client(self.mtls.address, tls_ca=self.key)
        self.assertIn("tls_ca", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
