#!/usr/bin/env python3
"""deploy/Dockerfile and scripts/image.sh build the same image, file for file where it matters.

    image_files_test.py <build bin dir>

"The file list" of an image is every file kplegd needs at run time, with the symlinks that lead
to them: the two binaries, the dynamic loader and every shared library they load (resolved the
way the loader resolves them in that image), and the programs `kplegd --self-test` runs (/bin/sh,
/bin/true), each at its path in a merged-/usr Debian 12 root. Everything else a debian:12-slim
image holds (apt, the shell utilities, documentation) is not kplegd's and not compared.

 - scripts/image.sh's list is what its layer holds (`scripts/image.sh list`): it holds nothing else.
 - deploy/Dockerfile's list is derived from the Dockerfile's text without building it: the files
   its COPY lines put in, plus what the loader finds for them among the files of the Debian
   packages the image has (the essential packages of this Debian 12 host as the base, apt, the
   `apt-get install` list and everything those depend on; `dpkg -L`), following symlinks.
The two lists must be equal; every package the Dockerfile installs must provide a file of the list
(no package the binaries do not need); both images must have the same entrypoint; and the loader,
pointed at the assembled root alone, must resolve every library of both binaries inside it.

Exit status: 0 pass, 1 fail, 77 cannot check here (not Debian 12, no dpkg/apt/readelf).
"""
import glob
import json
import os
import re
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DOCKERFILE = os.path.join(REPO, "deploy", "Dockerfile")
IMAGE_SH = os.path.join(REPO, "scripts", "image.sh")
# kplegd's self-test (userspace/selftest/self_test.cc) runs these in its scratch cgroup.
SELF_TEST_PROGRAMS = ["/bin/sh", "/bin/true"]
# Debian 12's merged /usr: these top-level directories are symlinks into /usr.
MERGED = ["/bin", "/sbin", "/lib", "/lib64", "/libx32", "/lib32"]


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def skip(msg):
    if os.environ.get("KPLEG_REQUIRE_PRIVILEGED") == "1":
        fail(msg + " (KPLEG_REQUIRE_PRIVILEGED=1 forbids skipping)")
    print("SKIP: " + msg)
    sys.exit(77)


def run(*cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, stdout=subprocess.PIPE, **kw).stdout


def usr(path):
    """The path in a merged-/usr root: /lib/x -> /usr/lib/x."""
    path = os.path.normpath(path)
    for m in MERGED:
        if path == m or path.startswith(m + "/"):
            return "/usr" + path
    return path


def parse_dockerfile():
    text = open(DOCKERFILE).read()
    # Join continuation lines, drop comments.
    lines = []
    for raw in re.sub(r"\\\n", " ", text).splitlines():
        if raw.strip() and not raw.lstrip().startswith("#"):
            lines.append(raw.strip())
    base, packages, copies, entrypoint = None, [], [], None
    for line in lines:
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            base = rest.split()[0]
        elif word == "RUN":
            for part in re.split(r"&&|;", rest):
                args = shlex.split(part)
                if args[:2] == ["apt-get", "install"]:
                    packages += [a for a in args[2:] if not a.startswith("-")]
        elif word == "COPY":
            args = shlex.split(rest)
            if any(a.startswith("--") for a in args):
                fail("COPY with options (%s): teach this test" % line)
            *srcs, dest = args
            if not dest.endswith("/"):
                fail("COPY %s: a destination directory (ending in /) is what this test reads" % rest)
            copies += [(s, dest + os.path.basename(s)) for s in srcs]
        elif word == "ENTRYPOINT":
            entrypoint = json.loads(rest)
        elif word in ("ENV", "LABEL", "USER", "WORKDIR", "ARG", "EXPOSE"):
            pass
        else:
            fail("Dockerfile instruction %s: teach this test what it adds to the image" % word)
    return base, packages, copies, entrypoint


def multiarch():
    try:
        return run("dpkg-architecture", "-qDEB_HOST_MULTIARCH", stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        return {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}[os.uname().machine]


def elf_needs(path):
    """(interpreter or None, [DT_NEEDED sonames], [DT_RUNPATH/RPATH dirs]) of an ELF file."""
    interp = None
    for line in run("readelf", "-lW", path).splitlines():
        m = re.search(r"Requesting program interpreter: (\S+)\]", line)
        if m:
            interp = m.group(1)
    needed, runpath = [], []
    for line in run("readelf", "-dW", path).splitlines():
        m = re.search(r"\((NEEDED|RUNPATH|RPATH)\)\s+.*\[(.*)\]", line)
        if m and m.group(1) == "NEEDED":
            needed.append(m.group(2))
        elif m:
            runpath += m.group(2).split(":")
    return interp, needed, runpath


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: image_files_test.py <build bin dir>")
    bindir = os.path.abspath(sys.argv[1])
    for tool in ("dpkg-query", "apt-cache", "readelf", "jq"):
        if subprocess.run(["sh", "-c", "command -v " + tool], stdout=subprocess.DEVNULL).returncode:
            skip("needs %s" % tool)
    osr = dict(re.findall(r'^(\w+)="?([^"\n]*)"?$', open("/etc/os-release").read(), re.M))
    if osr.get("ID") != "debian" or osr.get("VERSION_ID") != "12":
        skip("the Dockerfile's packages are read from this host's dpkg database: needs Debian 12")
    if not os.path.islink("/lib"):
        skip("this host is not merged-/usr like debian:12-slim")

    base, packages, copies, entrypoint = parse_dockerfile()
    if base not in ("debian:12-slim", "debian:bookworm-slim", "debian:12", "debian:bookworm"):
        fail("FROM %s: this test knows Debian 12 bases only" % base)
    if not packages:
        fail("no apt-get install list in %s" % DOCKERFILE)
    for src, _ in copies:
        if not src.startswith("build/bin/"):
            fail("COPY %s: only binaries from build/bin are expected" % src)

    # The image's packages: the base's essential ones, apt, the install list, and their
    # Depends/Pre-Depends (what --no-install-recommends installs), every branch of an "a | b".
    essential = [l.split()[0] for l in run("dpkg-query", "-W", "-f=${Package} ${Essential}\n").splitlines()
                 if l.endswith(" yes")]
    deps = run("apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
               "--no-breaks", "--no-replaces", "--no-enhances", *packages, *essential, "apt",
               stderr=subprocess.DEVNULL)
    image_pkgs = sorted({l.split(":")[0] for l in deps.splitlines() if l and not l.startswith(" ")})
    for p in packages:
        if p not in image_pkgs:
            fail("the Dockerfile installs %s, which apt does not know (apt-get update not run?)" % p)
    files = {}  # merged-/usr path in the image -> the package that ships it
    installed = set(run("dpkg-query", "-W", "-f=${Package}\n").split())
    for p in image_pkgs:
        if p not in installed:
            continue  # not on this host: it provides nothing the binaries load here either
        for f in run("dpkg-query", "-L", p, stderr=subprocess.DEVNULL).splitlines():
            if f.startswith("/") and not os.path.isdir(f):
                files.setdefault(usr(f), p)
    copied = {dest: os.path.join(bindir, os.path.basename(src)) for src, dest in copies}
    for dest in copied:
        files[dest] = "COPY"

    # What the loader finds, starting from the copied binaries and the self-test's programs.
    arch_dir = "/usr/lib/" + multiarch()
    search = [arch_dir, "/usr/lib"]
    listed = set()

    def host_path(path):
        return copied.get(path, path)

    def add(path, why):
        """Adds path (and, for a symlink, its target) to the list; returns the final file."""
        path = usr(path)
        if path not in files:
            fail("%s (%s) is in no package of the Dockerfile's image and no COPY" % (path, why))
        listed.add(path)
        real = host_path(path)
        if os.path.islink(real):
            target = os.readlink(real)
            return add(os.path.join(os.path.dirname(path), target), why)
        return path

    todo = [(dest, "COPY") for dest in copied] + [(p, "kplegd --self-test runs it") for p in SELF_TEST_PROGRAMS]
    seen = set()
    while todo:
        path, why = todo.pop()
        final = add(path, why)
        if final in seen:
            continue
        seen.add(final)
        interp, needed, runpath = elf_needs(host_path(final))
        if runpath:
            fail("%s has a RUNPATH/RPATH (%s): the image has no such directories" % (final, runpath))
        if interp:
            todo.append((interp, "the interpreter of " + final))
        for soname in needed:
            hit = next((d + "/" + soname for d in search if d + "/" + soname in files), None)
            if hit is None:
                fail("%s needs %s, which no package of the Dockerfile's image provides" % (final, soname))
            todo.append((hit, "needed by " + final))
    dockerfile_list = sorted(listed)

    # scripts/image.sh's list, without the merged-/usr top-level symlinks.
    env = dict(os.environ, KPLEG_BIN_DIR=bindir)
    image_list = run("bash", IMAGE_SH, "list", env=env).split()
    layout = sorted(p for p in image_list if p in MERGED)
    want = sorted(["/bin", "/lib", "/sbin"] + (["/lib64"] if os.path.islink("/lib64") else []))
    if layout != want:
        fail("scripts/image.sh's root has the top-level links %s; a merged-/usr root has %s" % (layout, want))
    image_list = sorted(p for p in image_list if p not in MERGED)

    status = 0
    for p in sorted(set(dockerfile_list) - set(image_list)):
        print("FAIL: %s is in the Dockerfile's image (%s) but not in scripts/image.sh's" % (p, files[p]))
        status = 1
    for p in sorted(set(image_list) - set(dockerfile_list)):
        print("FAIL: scripts/image.sh puts %s in its image; the Dockerfile's image does not need it" % p)
        status = 1
    used = {files[p] for p in dockerfile_list}
    for p in packages:
        if p not in used:
            print("FAIL: the Dockerfile installs %s, which provides no file kplegd or kplegctl needs" % p)
            status = 1

    # Same entrypoint; and the loader, given only the assembled root, resolves everything in it.
    tar = run("bash", IMAGE_SH, "build", env=env).strip()
    built = os.path.dirname(tar)
    config = json.load(open(os.path.join(built, "config.json")))
    if config["config"].get("Entrypoint") != entrypoint:
        print("FAIL: scripts/image.sh's entrypoint %s, the Dockerfile's %s"
              % (config["config"].get("Entrypoint"), entrypoint))
        status = 1
    rootfs = os.path.join(built, "rootfs")
    loader = os.path.realpath(os.path.join(rootfs, "usr/lib64/ld-linux-x86-64.so.2")) \
        if os.path.exists(os.path.join(rootfs, "usr/lib64")) else None
    if loader is None or not loader.startswith(rootfs):
        loader = glob.glob(os.path.join(rootfs, arch_dir.lstrip("/"), "ld-linux*.so*"))[0]
    for dest in copied:
        out = run(loader, "--list", "--inhibit-cache", "--library-path", rootfs + arch_dir,
                  os.path.join(rootfs, dest.lstrip("/")))
        for line in out.splitlines():
            m = re.match(r"\s*(\S+) => (\S+)", line)
            if m and not os.path.realpath(m.group(2)).startswith(rootfs + "/"):
                print("FAIL: in scripts/image.sh's root, %s of %s resolves outside it: %s"
                      % (m.group(1), dest, m.group(2)))
                status = 1
    if status == 0:
        print("PASS: deploy/Dockerfile's image and scripts/image.sh's have the same %d files for kplegd "
              "(from the COPY lines and %d Debian packages; the %d the Dockerfile names are all needed) "
              "and the same entrypoint %s" % (len(image_list), len(used - {"COPY"}), len(packages), entrypoint))
    return status


if __name__ == "__main__":
    sys.exit(main())
