#!/bin/sh
# Written by `multinode cluster up --slurm ${release}` (sandbox/releases.py says why). Runs SLURM ${release}'s command
# named like the link that called it, from the root file system ${rootfs}, with this machine's data folders in view.
name=$${0##*/}
if [ -e /${stamp} ]; then  # inside already: a job, a job step, a daemon's child
    [ -x "/usr/sbin/$$name" ] && exec "/usr/sbin/$$name" "$$@"
    exec "/usr/bin/$$name" "$$@"
fi
if [ "$${MULTINODE_ROOTFS_ENTERING:-}" != "$$$$" ]; then
    # A private mount namespace of its own (unshare execs in this process: the same pid marks the second pass).
    MULTINODE_ROOTFS_ENTERING=$$$$ exec unshare --mount --propagation private -- /bin/sh "$$0" "$$@"
fi
unset MULTINODE_ROOTFS_ENTERING
root=${rootfs}
# The root file system a mount point of its own: a container runtime inside (runc) remounts / as a slave, which
# fails on a plain folder.
mount --bind "$$root" "$$root" || exit 1
for d in /proc /sys /dev; do mount --rbind "$$d" "$$root$$d" || exit 1; done
# Every top-level data folder, and /var/tmp: job folders, the cluster folder, Python and its packages.
for d in /*/ /var/tmp/; do
    d=$${d%/}
    [ -L "$$d" ] && continue
    case "$$d" in
        /bin | /boot | /dev | /etc | /lib | /lib32 | /lib64 | /libx32 | /sbin | /usr | /var | /proc | /sys | /run) continue ;;
        /lost+found) continue ;;
    esac
    mkdir -p "$$root$$d" && mount --rbind "$$d" "$$root$$d" || exit 1
done
mount --bind /etc/hosts "$$root/etc/hosts" || exit 1  # a node's own, inside a node
if [ -n "$${SLURM_CONF:-}" ]; then  # this cluster's configuration where SLURM's tools look by default too
    mount --bind "$${SLURM_CONF%/*}" "$$root/etc/slurm" || exit 1
fi
cmd=/usr/bin/$$name
[ -x "$$root/usr/sbin/$$name" ] && cmd=/usr/sbin/$$name
here=$$PWD
# The root file system becomes this namespace's root (pivot_root, not chroot): paths the kernel reports for processes
# of nested namespaces (a container's /proc/<pid>/maps, which py-spy reads) are then the same as inside.
cd "$$root" && mkdir -p .host && pivot_root . .host && umount -l /.host || exit 1
exec /bin/sh -c 'cd "$$1" 2>/dev/null || cd /; shift; exec "$$@"' sh "$$here" "$$cmd" "$$@"
