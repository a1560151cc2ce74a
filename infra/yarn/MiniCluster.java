// Hadoop's own mini cluster in one JVM on loopback: HDFS (a NameNode and 1 DataNode, MiniDFSCluster) and YARN
// (a ResourceManager and 1 NodeManager, MiniYARNCluster), from the hadoop-client-minicluster artifact.
// Started and stopped by `eventlake yarn up|down` (infra/yarn.py), which compiles this file at first use.
//
// Arguments: CONF_DIR DATA_DIR NAMENODE_PORT RM_PORT NM_MEMORY_MB NM_VCORES
//   CONF_DIR       where the client configuration is written (core-site.xml, hdfs-site.xml, yarn-site.xml): what
//                  HADOOP_CONF_DIR names for spark-submit, hdfs clients, ...
//   DATA_DIR       the cluster's own files (NameNode and DataNode storage, NodeManager local and log dirs); HDFS
//                  keeps its files across a restart (the NameNode is formatted only when it has no storage yet)
//   NAMENODE_PORT  HDFS RPC; its web UI on the next port
//   RM_PORT        the ResourceManager's client port; scheduler, resource tracker, admin and web UI on the next four
// Once both answer it writes CONF_DIR/ready (the addresses) and prints "eventlake-yarn: ready"; SIGTERM stops
// YARN, then HDFS (a shutdown hook) and removes CONF_DIR/ready.
import java.io.File;
import java.io.FileOutputStream;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.LinkedHashMap;
import java.util.Map;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.hdfs.HdfsConfiguration;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.hadoop.yarn.client.api.YarnClient;
import org.apache.hadoop.yarn.conf.YarnConfiguration;
import org.apache.hadoop.yarn.server.MiniYARNCluster;

public final class MiniCluster {
    private static final String HOST = "127.0.0.1";

    public static void main(String[] args) {
        try {
            run(args);
        } catch (Throwable t) {  // a half-started cluster keeps non-daemon threads: end the JVM
            t.printStackTrace();
            System.err.println("eventlake-yarn: failed to start: " + t);
            System.exit(1);
        }
    }

    private static void run(String[] args) throws Exception {
        if (args.length != 6) {
            System.err.println("usage: MiniCluster CONF_DIR DATA_DIR NAMENODE_PORT RM_PORT NM_MEMORY_MB NM_VCORES");
            System.exit(2);
        }
        File confDir = new File(args[0]).getAbsoluteFile();
        File dataDir = new File(args[1]).getAbsoluteFile();
        int nnPort = Integer.parseInt(args[2]);
        int rmPort = Integer.parseInt(args[3]);
        int nmMemoryMb = Integer.parseInt(args[4]);
        int nmVcores = Integer.parseInt(args[5]);
        confDir.mkdirs();
        dataDir.mkdirs();
        File ready = new File(confDir, "ready");
        ready.delete();

        // ---- HDFS -----------------------------------------------------------------------------------------
        Configuration conf = new HdfsConfiguration();
        conf.set("hadoop.tmp.dir", new File(dataDir, "tmp").getPath());
        conf.setInt("dfs.replication", 1);
        conf.set("dfs.namenode.rpc-address", HOST + ":" + nnPort);
        conf.set("dfs.namenode.http-address", HOST + ":" + (nnPort + 1));
        conf.set("dfs.datanode.address", HOST + ":0");
        conf.set("dfs.datanode.http.address", HOST + ":0");
        conf.set("dfs.datanode.ipc.address", HOST + ":0");
        conf.setBoolean("dfs.permissions.enabled", false);  // one local user; nothing to protect from
        File hdfsDir = new File(dataDir, "hdfs");
        boolean fresh = !new File(hdfsDir, "name-0-1/current/VERSION").exists();
        MiniDFSCluster dfs = new MiniDFSCluster.Builder(conf, hdfsDir)
                .nameNodePort(nnPort).nameNodeHttpPort(nnPort + 1)
                .numDataNodes(1).format(fresh).manageNameDfsDirs(true).manageDataDfsDirs(true)
                .build();
        dfs.waitActive();
        String fsUri = "hdfs://" + HOST + ":" + nnPort;
        conf.set(FileSystem.FS_DEFAULT_NAME_KEY, fsUri);
        // What YARN apps need on HDFS: a world-writable /tmp (Spark's staging and event logs go under /user).
        FileSystem fs = FileSystem.get(conf);
        fs.mkdirs(new Path("/tmp"));
        fs.setPermission(new Path("/tmp"), new FsPermission((short) 01777));
        fs.mkdirs(new Path("/user"));
        fs.setPermission(new Path("/user"), new FsPermission((short) 0777));

        // ---- YARN -----------------------------------------------------------------------------------------
        YarnConfiguration yconf = new YarnConfiguration(conf);
        yconf.setBoolean(YarnConfiguration.YARN_MINICLUSTER_FIXED_PORTS, true);
        yconf.set(YarnConfiguration.RM_HOSTNAME, HOST);
        yconf.set(YarnConfiguration.RM_ADDRESS, HOST + ":" + rmPort);
        yconf.set(YarnConfiguration.RM_SCHEDULER_ADDRESS, HOST + ":" + (rmPort + 1));
        yconf.set(YarnConfiguration.RM_RESOURCE_TRACKER_ADDRESS, HOST + ":" + (rmPort + 2));
        yconf.set(YarnConfiguration.RM_ADMIN_ADDRESS, HOST + ":" + (rmPort + 3));
        yconf.set(YarnConfiguration.RM_WEBAPP_ADDRESS, HOST + ":" + (rmPort + 4));
        // The NodeManager's resources (the mini cluster reads its own key for the memory), and no memory
        // checks: a JVM's virtual memory is many times its heap, and this machine is shared.
        yconf.setInt(YarnConfiguration.YARN_MINICLUSTER_NM_PMEM_MB, nmMemoryMb);
        yconf.setInt(YarnConfiguration.NM_PMEM_MB, nmMemoryMb);
        yconf.setInt(YarnConfiguration.NM_VCORES, nmVcores);
        yconf.setBoolean(YarnConfiguration.NM_PMEM_CHECK_ENABLED, false);
        yconf.setBoolean(YarnConfiguration.NM_VMEM_CHECK_ENABLED, false);
        yconf.setInt(YarnConfiguration.RM_SCHEDULER_MINIMUM_ALLOCATION_MB, 128);
        yconf.setInt(YarnConfiguration.RM_SCHEDULER_MAXIMUM_ALLOCATION_MB, nmMemoryMb);
        yconf.setInt(YarnConfiguration.RM_SCHEDULER_MAXIMUM_ALLOCATION_VCORES, nmVcores);
        // A full disk elsewhere must not mark the NodeManager unhealthy (it would get no containers).
        yconf.setFloat("yarn.nodemanager.disk-health-checker.max-disk-utilization-per-disk-percentage", 100.0f);
        // The capacity scheduler with one queue that may give all of it, application masters included.
        yconf.set("yarn.scheduler.capacity.root.queues", "default");
        yconf.setInt("yarn.scheduler.capacity.root.default.capacity", 100);
        yconf.setInt("yarn.scheduler.capacity.root.default.maximum-capacity", 100);
        yconf.setFloat("yarn.scheduler.capacity.root.default.user-limit-factor", 1);
        yconf.set("yarn.scheduler.capacity.root.default.state", "RUNNING");
        yconf.set("yarn.scheduler.capacity.root.default.acl_submit_applications", "*");
        yconf.set("yarn.scheduler.capacity.root.default.acl_administer_queue", "*");
        yconf.setFloat("yarn.scheduler.capacity.maximum-am-resource-percent", 0.9f);
        yconf.setInt("yarn.scheduler.capacity.node-locality-delay", -1);
        // Containers run with the NodeManager's JAVA_HOME (and PATH, for python).
        yconf.set(YarnConfiguration.NM_ENV_WHITELIST,
                "JAVA_HOME,PATH,HADOOP_COMMON_HOME,HADOOP_HDFS_HOME,HADOOP_CONF_DIR,HADOOP_YARN_HOME,"
                        + "HADOOP_MAPRED_HOME,LANG,TZ");
        // Finished containers' logs stay in the NodeManager's log dirs for a while (no aggregation to HDFS).
        yconf.setLong(YarnConfiguration.DEBUG_NM_DELETE_DELAY_SEC, 600);

        // MiniYARNCluster puts its local and log dirs under ./target/<name>: the JVM runs in DATA_DIR.
        MiniYARNCluster yarn = new MiniYARNCluster("eventlake-yarn", 1, 1, 1, 1);
        yarn.init(yconf);
        yarn.start();
        waitForNodeManager(yarn.getConfig());
        Configuration live = yarn.getConfig();

        // ---- the client configuration --------------------------------------------------------------------
        Map<String, String> core = new LinkedHashMap<>();
        core.put(FileSystem.FS_DEFAULT_NAME_KEY, fsUri);
        Map<String, String> hdfs = new LinkedHashMap<>();
        hdfs.put("dfs.replication", "1");
        hdfs.put("dfs.permissions.enabled", "false");
        Map<String, String> yarnSite = new LinkedHashMap<>();
        for (String key : new String[] {YarnConfiguration.RM_HOSTNAME, YarnConfiguration.RM_ADDRESS,
                YarnConfiguration.RM_SCHEDULER_ADDRESS, YarnConfiguration.RM_RESOURCE_TRACKER_ADDRESS,
                YarnConfiguration.RM_ADMIN_ADDRESS, YarnConfiguration.RM_WEBAPP_ADDRESS}) {
            yarnSite.put(key, live.get(key));
        }
        yarnSite.put(YarnConfiguration.RM_SCHEDULER_MINIMUM_ALLOCATION_MB, "128");
        yarnSite.put(YarnConfiguration.RM_SCHEDULER_MAXIMUM_ALLOCATION_MB, Integer.toString(nmMemoryMb));
        writeSite(new File(confDir, "core-site.xml"), core);
        writeSite(new File(confDir, "hdfs-site.xml"), hdfs);
        writeSite(new File(confDir, "yarn-site.xml"), yarnSite);

        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            ready.delete();
            System.out.println("eventlake-yarn: stopping");
            try { yarn.stop(); } catch (Throwable t) { t.printStackTrace(); }
            try { dfs.shutdown(); } catch (Throwable t) { t.printStackTrace(); }
            System.out.println("eventlake-yarn: stopped");
            System.out.flush();
        }, "eventlake-yarn-stop"));

        String web = "http://" + live.get(YarnConfiguration.RM_WEBAPP_ADDRESS);
        String line = "fs=" + fsUri + "\nrm=" + live.get(YarnConfiguration.RM_ADDRESS) + "\nweb=" + web
                + "\nhdfs_web=http://" + HOST + ":" + (nnPort + 1) + "\n";
        File partial = new File(confDir, "ready.partial");
        Files.write(partial.toPath(), line.getBytes(StandardCharsets.UTF_8));
        Files.move(partial.toPath(), ready.toPath(), java.nio.file.StandardCopyOption.ATOMIC_MOVE);
        System.out.println("eventlake-yarn: ready; HDFS " + fsUri + ", ResourceManager "
                + live.get(YarnConfiguration.RM_ADDRESS) + " (web " + web + "), conf " + confDir);
        System.out.flush();
        Thread.currentThread().join();  // until SIGTERM
    }

    /** Wait until the ResourceManager lists a running NodeManager (an app submitted earlier would wait for one). */
    private static void waitForNodeManager(Configuration conf) throws Exception {
        YarnClient client = YarnClient.createYarnClient();
        client.init(conf);
        client.start();
        try {
            long deadline = System.currentTimeMillis() + 120_000;
            while (client.getYarnClusterMetrics().getNumNodeManagers() < 1) {
                if (System.currentTimeMillis() > deadline) {
                    throw new IllegalStateException("no NodeManager registered with the ResourceManager in 120 s");
                }
                Thread.sleep(200);
            }
        } finally {
            client.stop();
        }
    }

    private static void writeSite(File file, Map<String, String> properties) throws Exception {
        StringBuilder xml = new StringBuilder("<?xml version=\"1.0\"?>\n"
                + "<!-- written by eventlake's YARN mini cluster (infra/yarn/MiniCluster.java) -->\n<configuration>\n");
        for (Map.Entry<String, String> e : properties.entrySet()) {
            xml.append("  <property><name>").append(e.getKey()).append("</name><value>").append(e.getValue())
                    .append("</value></property>\n");
        }
        xml.append("</configuration>\n");
        try (OutputStream out = new FileOutputStream(file)) {
            out.write(xml.toString().getBytes(StandardCharsets.UTF_8));
        }
    }
}
