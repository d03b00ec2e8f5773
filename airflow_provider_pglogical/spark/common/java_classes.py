"""Java classes the job calls through py4j, looked up once per JVM.

py4j resolves ``jvm.org.apache.iceberg.DataFiles`` one name at a time: it asks the JVM for a
class ``org``, then ``org.apache``, and so on, and each miss searches every jar on the driver's
class path. That is about 1 ms of the driver's CPU per access, and a small step (``row_deltas.py``)
made dozens of them, per table, per tick, while the JVM had the two cores to itself otherwise.
A class looked up here is resolved once; calling its static members afterwards costs one
round trip.
"""

from __future__ import annotations

import functools
import threading
import weakref

_lock = threading.Lock()
_classes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def java_class(spark, name: str):
    """The Java class ``name`` (fully qualified, or a primitive such as ``int``) of ``spark``'s JVM:
    a py4j ``JavaClass`` (py4j is imported here: the job's modules import without it)."""
    from py4j.java_gateway import JavaClass

    gateway = spark.sparkContext._gateway
    with _lock:
        known = _classes.setdefault(gateway, {})
        found = known.get(name)
    if found is None:
        found = functools.reduce(getattr, name.split("."), gateway.jvm)
        if not isinstance(found, JavaClass):
            raise LookupError(f"Java class {name} is not on the Spark driver's class path")
        with _lock:
            known[name] = found
    return found


def java_list(spark, values: list):
    """``values`` (ints, strings, decimals, bytes, floats, booleans) as one ``java.util.List``, in one
    py4j round trip: pickled here, unpickled by the JVM's ``net.razorvine.pickle`` (Spark's own
    PySpark serialiser, on every Spark's class path). py4j's own conversion of a Python list makes
    a round trip per element (``ArrayList.add``)."""
    import pickle

    return java_class(spark, "net.razorvine.pickle.Unpickler")().loads(pickle.dumps(list(values), protocol=2))
