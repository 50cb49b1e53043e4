"""Test certificates made with the openssl command line: a CA, a server certificate for
127.0.0.1 / localhost, and a client certificate for mTLS."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@dataclass
class Pki:
    dir: Path
    ca: Path
    ca_key: Path

    def issue(self, name: str, *, client: bool = False, cn: str = "127.0.0.1") -> tuple[Path, Path]:
        """A certificate and key signed by this CA; a server one has SANs 127.0.0.1 and localhost."""
        key, csr, crt, ext = (self.dir / f"{name}.{s}" for s in ("key", "csr", "crt", "ext"))
        _run("genrsa", "-out", str(key), "2048", cwd=self.dir)
        _run("req", "-new", "-key", str(key), "-out", str(csr), "-subj", f"/CN={cn}", cwd=self.dir)
        if client:
            ext.write_text("extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n")
        else:
            ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
                           "keyUsage=digitalSignature,keyEncipherment\n")
        _run("x509", "-req", "-in", str(csr), "-CA", str(self.ca), "-CAkey", str(self.ca_key), "-CAcreateserial",
             "-out", str(crt), "-days", "2", "-sha256", "-extfile", str(ext), cwd=self.dir)
        return crt, key


def make_ca(dir: Path, name: str = "ca") -> Pki:
    """A self-signed CA in `dir`."""
    dir.mkdir(parents=True, exist_ok=True)
    key, crt = dir / f"{name}.key", dir / f"{name}.crt"
    _run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(crt), "-days", "2",
         "-subj", f"/CN=inferwatch-e2e-{name}", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=dir)
    return Pki(dir, crt, key)
