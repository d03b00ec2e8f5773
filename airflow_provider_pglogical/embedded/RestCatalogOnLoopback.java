// Iceberg's own REST catalog test fixture (RESTCatalogAdapter + RESTCatalogServlet from
// iceberg-core's tests jar), served on 127.0.0.1 only and behind OAuth2 client credentials.
//
// Started by airflow_provider_pglogical/embedded/rest_catalog.py (the tests and the demo) with
// `java -cp <resolved jars> RestCatalogOnLoopback.java <port>` (the JDK's source launcher). Why
// not the fixture's own RESTCatalogServer main: it listens on every interface and issues a token
// to any client. Here the token endpoint refuses a client id or secret other than the ones in
// REST_CLIENT_ID / REST_CLIENT_SECRET (the environment, never the command line), and every other
// request must bear the token it issued, so a test proves the credentials really reached Spark.
// The backing catalog is configured as the fixture's image is: CATALOG_* variables become catalog
// properties (CATALOG_IO__IMPL -> io-impl, CATALOG_S3_ENDPOINT -> s3.endpoint). Every request it
// serves is logged by Jetty's request log (method, path, status, milliseconds; never a header or a
// body), which the benchmarks and tests count (request_logs.py).

import jakarta.servlet.DispatcherType;
import jakarta.servlet.Filter;
import jakarta.servlet.FilterChain;
import jakarta.servlet.ReadListener;
import jakarta.servlet.ServletInputStream;
import jakarta.servlet.ServletRequest;
import jakarta.servlet.ServletResponse;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletRequestWrapper;
import jakarta.servlet.http.HttpServletResponse;
import java.io.BufferedReader;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.util.EnumSet;
import java.util.HashMap;
import java.util.Locale;
import java.util.Map;
import org.apache.hadoop.conf.Configuration;
import org.apache.iceberg.CatalogUtil;
import org.apache.iceberg.rest.RESTCatalogAdapter;
import org.apache.iceberg.rest.RESTCatalogServlet;
import org.eclipse.jetty.server.CustomRequestLog;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import org.eclipse.jetty.server.Slf4jRequestLogWriter;
import org.eclipse.jetty.servlet.FilterHolder;
import org.eclipse.jetty.servlet.ServletContextHandler;
import org.eclipse.jetty.servlet.ServletHolder;

public class RestCatalogOnLoopback {
  public static void main(String[] args) throws Exception {
    Map<String, String> properties = new HashMap<>();
    System.getenv().forEach((name, value) -> {
      if (name.startsWith("CATALOG_")) {
        String key = name.substring(8).replace("__", "-").replace('_', '.').toLowerCase(Locale.ROOT);
        properties.put(key, value);
      }
    });
    properties.putIfAbsent("catalog-impl", "org.apache.iceberg.jdbc.JdbcCatalog");
    properties.putIfAbsent("uri", "jdbc:sqlite::memory:");
    properties.putIfAbsent("jdbc.schema-version", "V1");
    var catalog = CatalogUtil.buildIcebergCatalog("rest_backend", properties, new Configuration());

    ServletContextHandler context = new ServletContextHandler(ServletContextHandler.NO_SESSIONS);
    context.addServlet(new ServletHolder(new RESTCatalogServlet(new RESTCatalogAdapter(catalog))), "/*");
    String clientId = System.getenv("REST_CLIENT_ID");
    if (clientId != null) {
      Filter filter = new ClientCredentials(clientId, System.getenv("REST_CLIENT_SECRET"));
      context.addFilter(new FilterHolder(filter), "/*", EnumSet.of(DispatcherType.REQUEST));
    }
    Server server = new Server();
    ServerConnector connector = new ServerConnector(server);
    connector.setHost("127.0.0.1");
    connector.setPort(Integer.parseInt(args[0]));
    server.addConnector(connector);
    server.setHandler(context);
    server.setRequestLog(new CustomRequestLog(new Slf4jRequestLogWriter(), "served %m %U%q %s %{ms}T"));
    server.start();
    System.out.println("rest catalog ready on http://127.0.0.1:" + connector.getLocalPort());
    server.join();
  }

  /** The token endpoint checks the client's id and secret; every other request needs its token. */
  static final class ClientCredentials implements Filter {
    private final String clientId;
    private final String clientSecret;
    private final String token;

    ClientCredentials(String clientId, String clientSecret) {
      this.clientId = clientId;
      this.clientSecret = clientSecret;
      this.token = "client-credentials-token:sub=" + clientId; // what the fixture's adapter issues
    }

    @Override
    public void doFilter(ServletRequest req, ServletResponse res, FilterChain chain)
        throws IOException, jakarta.servlet.ServletException {
      HttpServletRequest request = (HttpServletRequest) req;
      HttpServletResponse response = (HttpServletResponse) res;
      if (request.getRequestURI().endsWith("/v1/oauth/tokens")) {
        byte[] body = request.getInputStream().readAllBytes();
        Map<String, String> form = form(new String(body, StandardCharsets.UTF_8));
        if (!clientId.equals(form.get("client_id")) || !clientSecret.equals(form.get("client_secret"))) {
          refuse(response, "invalid_client");
          return;
        }
        chain.doFilter(new Replayed(request, body), response);
      } else if (("Bearer " + token).equals(request.getHeader("Authorization"))) {
        chain.doFilter(request, response);
      } else {
        refuse(response, "invalid_token");
      }
    }

    private static void refuse(HttpServletResponse response, String error) throws IOException {
      response.setStatus(401);
      response.setContentType("application/json");
      response.getWriter().write("{\"error\":\"" + error + "\"}");
    }

    private static Map<String, String> form(String body) {
      Map<String, String> form = new HashMap<>();
      for (String pair : body.split("&")) {
        int equals = pair.indexOf('=');
        if (equals > 0) {
          form.put(URLDecoder.decode(pair.substring(0, equals), StandardCharsets.UTF_8),
              URLDecoder.decode(pair.substring(equals + 1), StandardCharsets.UTF_8));
        }
      }
      return form;
    }
  }

  /** A request whose body, read once by the filter, the servlet reads again. */
  static final class Replayed extends HttpServletRequestWrapper {
    private final byte[] body;

    Replayed(HttpServletRequest request, byte[] body) {
      super(request);
      this.body = body;
    }

    @Override
    public ServletInputStream getInputStream() {
      ByteArrayInputStream bytes = new ByteArrayInputStream(body);
      return new ServletInputStream() {
        @Override public int read() { return bytes.read(); }
        @Override public boolean isFinished() { return bytes.available() == 0; }
        @Override public boolean isReady() { return true; }
        @Override public void setReadListener(ReadListener listener) { }
      };
    }

    @Override
    public BufferedReader getReader() {
      return new BufferedReader(new InputStreamReader(getInputStream(), StandardCharsets.UTF_8));
    }
  }
}
