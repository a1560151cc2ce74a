#!/bin/bash
# The image's entrypoint. `driver` and `executor` are how Spark on Kubernetes (and so the Spark operator) starts
# its pods: the same protocol as Apache Spark's own Kubernetes image (resource-managers/kubernetes/docker,
# entrypoint.sh): the driver runs spark-submit in client mode inside its pod, an executor runs
# KubernetesExecutorBackend with what the driver put in its environment. Anything else is run as given
# (`eventlake handler`, `airflow scheduler`, `bash -c ...` from the Airflow chart).
# tini forwards SIGTERM to the whole process group (-g): the Python app under spark-submit gets it too and stops
# its queries within seconds.
set -euo pipefail

if ! getent passwd "$(id -u)" >/dev/null 2>&1 && [ -w /etc/passwd ]; then
  echo "$(id -u):x:$(id -u):$(id -g):anonymous uid:${HOME:-/tmp}:/bin/false" >> /etc/passwd
fi

SPARK_CLASSPATH="${SPARK_CLASSPATH:-}:${SPARK_HOME:-}/jars/*"
if [ -n "${SPARK_EXTRA_CLASSPATH:-}" ]; then SPARK_CLASSPATH="$SPARK_CLASSPATH:$SPARK_EXTRA_CLASSPATH"; fi
if [ -n "${SPARK_CONF_DIR:-}" ]; then SPARK_CLASSPATH="$SPARK_CONF_DIR:$SPARK_CLASSPATH"; fi
if [ -n "${HADOOP_CONF_DIR:-}" ]; then SPARK_CLASSPATH="$HADOOP_CONF_DIR:$SPARK_CLASSPATH"; fi
SPARK_CLASSPATH="$SPARK_CLASSPATH:$PWD"

case "${1:-}" in
  driver)
    shift
    CMD=("$SPARK_HOME/bin/spark-submit"
         --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS}"
         --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=${SPARK_DRIVER_BIND_ADDRESS}"
         --deploy-mode client "$@")
    ;;
  executor)
    shift
    JAVA_OPTS=()
    for v in "${!SPARK_JAVA_OPT_@}"; do JAVA_OPTS+=("${!v}"); done
    CMD=("$JAVA_HOME/bin/java" "${JAVA_OPTS[@]}"
         -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}"
         -cp "$SPARK_CLASSPATH:${SPARK_DIST_CLASSPATH:-}"
         org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend
         --driver-url "$SPARK_DRIVER_URL" --executor-id "$SPARK_EXECUTOR_ID" --cores "$SPARK_EXECUTOR_CORES"
         --app-id "$SPARK_APPLICATION_ID" --hostname "$SPARK_EXECUTOR_POD_IP"
         --resourceProfileId "$SPARK_RESOURCE_PROFILE_ID" --podName "$SPARK_EXECUTOR_POD_NAME")
    ;;
  *)
    CMD=("$@")
    ;;
esac
exec /usr/bin/tini -s -g -- "${CMD[@]}"
