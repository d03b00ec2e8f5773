"""A real Iceberg REST catalog on loopback, for the demo's ``--lakehouse rest`` and the tests.

The server is Apache Iceberg's own REST test fixture (the ``RESTCatalogAdapter`` and
``RESTCatalogServlet`` the ``apache/iceberg-rest-fixture`` image serves, backed by a ``JdbcCatalog``
on an in-memory SQLite database), run from its canonical Maven artifacts: set-up resolves them
once with Maven (``python -m airflow_provider_pglogical.embedded.rest_catalog``) into a local
folder, checks each file against the sha256 pinned below, and from then on the server starts
offline. ``RestCatalogOnLoopback.java`` (run by the JDK's source launcher) binds it to 127.0.0.1
and puts OAuth2 client credentials in front of it. Its warehouse is on S3 (moto's server) through
Iceberg's ``S3FileIO``; the keys reach it through its environment, never its command line.
Nothing here runs in production: a deployment points ``IcebergConfig`` at its own catalog.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from airflow_provider_pglogical.embedded.postgres import free_port
from airflow_provider_pglogical.embedded.readiness import stop_process, wait_for_http

ICEBERG_VERSION = "1.10.1"
LAUNCHER = Path(__file__).with_name("RestCatalogOnLoopback.java")
#: the fixture's top-level Maven artifacts (group, artifact, version, classifier); Maven adds their dependencies
ARTIFACTS = (
    ("org.apache.iceberg", "iceberg-open-api", ICEBERG_VERSION, "test-fixtures"),
    ("org.apache.iceberg", "iceberg-core", ICEBERG_VERSION, ""),
    ("org.apache.iceberg", "iceberg-core", ICEBERG_VERSION, "tests"),
    ("org.apache.iceberg", "iceberg-aws", ICEBERG_VERSION, ""),
    ("org.apache.iceberg", "iceberg-aws-bundle", ICEBERG_VERSION, ""),
    ("org.apache.hadoop", "hadoop-client-api", "3.4.1", ""),
    ("org.apache.hadoop", "hadoop-client-runtime", "3.4.1", ""),
    ("org.eclipse.jetty", "jetty-servlet", "11.0.26", ""),
    ("org.xerial", "sqlite-jdbc", "3.50.3.0", ""),
    ("org.slf4j", "slf4j-simple", "2.0.17", ""),
)
#: every file the resolution yields, with the sha256 set-up refuses any other file for
PINNED = {
    "RoaringBitmap-1.3.0.jar": "73443a71a2e2401c7d518a487983539fcaf5f9652efbd178f929e7b6d36881d0",
    "aircompressor-0.27.jar": "fdbef3137a28f63bb0cb93487803080ede746a4ec3d421e36c6f0c305c35e5e4",
    "avro-1.12.0.jar": "1f5fbfff9b7427d6832cc3031a3c81413d3e21d9e2551847d9231c28493f9492",
    "caffeine-2.9.3.jar": "1e0a7bbef1dd791653143f3f05d0e489934bf5481e58a87c9e619cd46b68729b",
    "checker-qual-3.19.0.jar": "a827c49183f3a632277d27a0a4673686cb341507447b9d570261094bd748aa68",
    "commons-codec-1.17.0.jar": "f700de80ac270d0344fdea7468201d8b9c805e5c648331c3619f2ee067ccfc59",
    "commons-compress-1.26.2.jar": "9168a03141d8fc7eda21a2360d83cc0412bcbb1d6204d992bd48c2573cb3c6b8",
    "commons-io-2.16.1.jar": "f41f7baacd716896447ace9758621f62c1c6b0a91d89acee488da26fc477c84f",
    "commons-lang3-3.14.0.jar": "7b96bf3ee68949abb5bc465559ac270e0551596fa34523fddf890ec418dde13c",
    "commons-logging-1.2.jar": "daddea1ea0be0f56978ab3006b8ac92834afeefbd9b7e4e6316fca57df0fa636",
    "error_prone_annotations-2.10.0.jar": "a249d4d25dfb86d41e6c82fc335df580189f0c9feeabdc53233fc1e5060724a1",
    "failsafe-3.3.2.jar": "2c5dc879a6dac7ea3a7b29d795e27bd49b8e7908b05c2f3e56053c19d79850f5",
    "hadoop-client-api-3.4.1.jar": "a964d4daa054c9615bbafb4553efbb140fa7fb9ac6f358a24393f183a5703438",
    "hadoop-client-runtime-3.4.1.jar": "f6a800a159f918670db533606d33560d6c13b7e13f14eda493280ae33b9eeb2f",
    "httpclient5-5.5.jar": "496b4b0e8d5f3a8139a5d2638486d304758bac3a9c39d76989f663cfd9354fc9",
    "httpcore5-5.3.4.jar": "f2b2fd7a0164e8c3120cd8437bc9fea439239e165c17262b3e907daa7e979f80",
    "httpcore5-h2-5.3.4.jar": "1fb4f34e4b612e7c127ad693335583587850b17ce9b1c366f9de1ca49fe2c781",
    "iceberg-api-1.10.1.jar": "9c806b96f20882d1e5e7a4b9a8d7bc1fa32917b509af4e6d139afaa09a288396",
    "iceberg-aws-1.10.1.jar": "28229076a64512513e7142e7a5cf088dc18393c066887373d9c0616ba0c071b3",
    "iceberg-aws-bundle-1.10.1.jar": "86bf20892ea5b4c17688f19b075399885f6aa5303f6b2dc9f491e76ceef9633b",
    "iceberg-bundled-guava-1.10.1.jar": "05b79072e19071b1bcf7a4e382d624b3b2ccad6eaf79627676219bb48e4e834d",
    "iceberg-common-1.10.1.jar": "167791c08975f299ebae6c508ea872b899673c33dc2911e4c265f95b96a656f1",
    "iceberg-core-1.10.1-tests.jar": "8c18111a61ea40ba23114e10e33bacfceca6cf36d2c9a932d880e0100f14af1e",
    "iceberg-core-1.10.1.jar": "5dc1472e3a393d9d5a713aedee7007cebdf62cabbe82c72feb6d3da8e50d7216",
    "iceberg-open-api-1.10.1-test-fixtures.jar": "ec4dce1663933e3520227da8238a980d52b7eccac532c1953f337dc1e6ee597b",
    "jackson-annotations-2.19.2.jar": "e516743a316dcf83c572ffc9cb6e8c5e8c134880c8c5155b02f7b34e9c5dc3cf",
    "jackson-core-2.19.2.jar": "aa77eaf29293a868c47372194f7c5287d77d9370b04ea25d3fffc1e4904b5880",
    "jackson-databind-2.19.2.jar": "0a1bd4e9b0d670e632d40ee8c625ad376233502f03c2f5889baea95d025b47a7",
    "jetty-http-11.0.26.jar": "de738c8cfd5701627b5373c42376453beb8276f989d75e5258e3b1ffe217e938",
    "jetty-io-11.0.26.jar": "ce0ef76071e361d97f102e5cb48928b3cc66ac899d12be3ef0af8d06b4f768a1",
    "jetty-jakarta-servlet-api-5.0.2.jar": "efb20997729f32bfa6c8a8319037c353f7ad460d5d49f336bf232998ea2358db",
    "jetty-security-11.0.26.jar": "1f0a1b58304741f243e2f6ac694e6506b1e26bb079cfc2baaa3f2a6ed4bf2d9f",
    "jetty-server-11.0.26.jar": "3cc3b203b96c7115151ea94cad8af43c0914bfb6fe20cf2ca8378ec6822fa471",
    "jetty-servlet-11.0.26.jar": "c09469f1045f9e207732692b3bc56e8fe4d0599de52d3bd593927c4a9060e679",
    "jetty-util-11.0.26.jar": "1b61b875a6d40e8fd44cffb307bdb66f3459370a152a50a092a698c3737eeca9",
    "jsr305-3.0.2.jar": "766ad2a0783f2687962c8ad74ceecc38a28b9f72a2d085ee438b7813e928d0c7",
    "slf4j-api-2.0.17.jar": "7b751d952061954d5abfed7181c1f645d336091b679891591d63329c622eb832",
    "slf4j-simple-2.0.17.jar": "ddfea59ac074c6d3e24ac2c38622d2d963895e17f70b38ed4bdae4d780be6964",
    "snappy-java-1.1.10.4.jar": "55b30c94e5c4cc2d4b6976916098d0678a8a6cc7427fa8c875621bd94e731ac8",
    "sqlite-jdbc-3.50.3.0.jar": "a3f53a2aa15ae9425a9e793bbe9c8e5288febeb4b65ef5c1a4e80d4c2045cf08",
}
JARS_SUBDIR = ("share", "airflow-provider-pglogical", "rest-catalog")
RESOLVE_HINT = ("run `bash scripts/setup.sh`, or `python -m airflow_provider_pglogical.embedded.rest_catalog` "
                "(Maven and a JDK 17 on PATH; it resolves Iceberg's REST fixture from Maven Central once)")


class RestCatalogUnavailable(RuntimeError):
    """The REST catalog's jars are not resolved, or the server did not start."""


def jars_directory() -> Path:
    """``$PGLOGICAL_REST_CATALOG_JARS``, else ``<sys.prefix>/share/airflow-provider-pglogical/rest-catalog``."""
    return Path(os.environ.get("PGLOGICAL_REST_CATALOG_JARS") or Path(sys.prefix, *JARS_SUBDIR))


def problems(folder: Path | None = None) -> list[str]:
    """Missing files and checksum mismatches in the server's jar folder."""
    folder = folder or jars_directory()
    found = []
    for name, sha256 in PINNED.items():
        path = folder / name
        if not path.is_file():
            found.append(f"{name} is missing")
        elif (digest := hashlib.sha256(path.read_bytes()).hexdigest()) != sha256:
            found.append(f"{name} has sha256 {digest}, not the pinned {sha256}")
    return found


def _pom() -> str:
    dependencies = "".join(
        f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId><version>{version}</version>"
        + (f"<classifier>{classifier}</classifier>" if classifier else "") + "</dependency>"
        for group, artifact, version, classifier in ARTIFACTS)
    return ('<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
            "<groupId>local</groupId><artifactId>pglogical-rest-catalog</artifactId><version>1</version>"
            f"<dependencies>{dependencies}</dependencies></project>")


def resolve(folder: Path | None = None) -> Path:
    """Resolve the fixture's jars into ``folder`` with Maven (once), then check every checksum."""
    folder = folder or jars_directory()
    if problems(folder):
        if shutil.which("mvn") is None:
            raise RestCatalogUnavailable(f"Maven (mvn) is not on PATH to resolve the REST catalog's jars: {RESOLVE_HINT}")
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as work:
            Path(work, "pom.xml").write_text(_pom())
            subprocess.run(["mvn", "-q", "-B", "dependency:copy-dependencies", f"-DoutputDirectory={folder}",
                            "-DincludeScope=runtime"], cwd=work, check=True)
    wrong = problems(folder)
    if wrong:
        raise RestCatalogUnavailable(f"{folder} does not hold the REST catalog's pinned jars: {'; '.join(wrong)}. "
                                     "Delete the listed files and resolve again; a checksum that still differs "
                                     "is a file the registry served other than the one pinned: do not use it")
    return folder


@dataclass
class RestCatalogServer:
    """A running REST catalog: its URI (for ``IcebergConfig.catalog_uri``), and the process to stop."""

    uri: str
    process: subprocess.Popen
    log_path: Path

    def stop(self) -> None:
        stop_process(self.process)


@dataclass(frozen=True)
class RestCatalogSettings:
    """What the server needs: its warehouse on S3 and how to reach it, and the client it admits.

    :param warehouse: ``s3://bucket/prefix`` where the catalog puts new tables.
    :param s3_endpoint: the S3 server (moto's, on loopback).
    :param client_id: the OAuth2 client the token endpoint admits (with ``client_secret``).
    """

    warehouse: str
    s3_endpoint: str
    access_key: str
    secret_key: str
    client_id: str
    client_secret: str
    region: str = "us-east-1"

    def environment(self) -> dict[str, str]:
        """The server's settings as its environment (the fixture's ``CATALOG_*`` convention). One
        JDBC client (``clients``): each connection to ``jdbc:sqlite::memory:`` is a database of its own,
        so a second pooled connection, opened by two concurrent requests, would see no table."""
        return {"CATALOG_CLIENTS": "1", "CATALOG_WAREHOUSE": self.warehouse, "CATALOG_IO__IMPL": "org.apache.iceberg.aws.s3.S3FileIO",
                "CATALOG_S3_ENDPOINT": self.s3_endpoint, "CATALOG_S3_PATH__STYLE__ACCESS": "true",
                "CATALOG_S3_ACCESS__KEY__ID": self.access_key, "CATALOG_S3_SECRET__ACCESS__KEY": self.secret_key,
                "CATALOG_CLIENT_REGION": self.region,
                "REST_CLIENT_ID": self.client_id, "REST_CLIENT_SECRET": self.client_secret}


def java_executable(env: Mapping[str, str]) -> str:
    """The JDK's ``java`` (``$JAVA_HOME`` first): the source launcher needs a JDK, not a JRE."""
    home = env.get("JAVA_HOME")
    return str(Path(home, "bin", "java")) if home else (shutil.which("java") or "java")


def start_rest_catalog(settings: RestCatalogSettings, env: Mapping[str, str] | None = None,
                       log_dir: Path | None = None, timeout: float = 120) -> RestCatalogServer:
    """Start the fixture on a free loopback port (a session of its own); returns once it answers."""
    folder = jars_directory()
    missing = problems(folder)
    if missing:
        raise RestCatalogUnavailable(f"the REST catalog's jars are not ready in {folder} ({missing[0]}): {RESOLVE_HINT}")
    port = free_port()
    environment = {**(os.environ if env is None else env), **settings.environment()}
    log_path = Path(log_dir or tempfile.gettempdir(), f"pglogical-rest-catalog-{port}.log")
    with os.fdopen(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as log:  # private
        process = subprocess.Popen(
            [java_executable(environment), "-Xmx512m", "-XX:TieredStopAtLevel=1", "-cp", f"{folder}/*",
             str(LAUNCHER), str(port)], env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = RestCatalogServer(f"http://127.0.0.1:{port}", process, log_path)

    try:  # without a token the catalog answers 401: it is up
        wait_for_http(f"{server.uri}/v1/config", process, timeout=timeout, what="the REST catalog",
                      answering_codes={401}, exited=lambda code:
                      RestCatalogUnavailable(f"the REST catalog exited with code {code}: see {log_path}"))
    except BaseException:
        server.stop()
        raise
    return server


if __name__ == "__main__":
    print(f"rest_catalog: the REST catalog's jars are in {resolve()}")
