use super::*;

const HEAD: &str = ".version 8.5\n.target sm_80\n.address_size 64\n\n";

fn module(body: &str) -> String {
    format!("{HEAD}{body}")
}

fn one(ptx: &str) -> Kernel {
    let r = rewrite(ptx).expect("rewrite");
    assert_eq!(r.kernels.len(), 1, "{r:?}");
    r.kernels[0].clone()
}

fn refused(ptx: &str) -> Refusal {
    match one(ptx).outcome {
        Outcome::Whole(why) => why,
        o => panic!("sliced: {o:?}"),
    }
}

/// What nvcc 13 writes for `out[blockIdx.x * blockDim.x + threadIdx.x] = n` with a grid-stride.
const SCALE: &str = r#"	// .globl	_Z5scalePfj
.visible .entry _Z5scalePfj(
	.param .u64 .ptr .align 1 _Z5scalePfj_param_0,
	.param .u32 _Z5scalePfj_param_1
)
.maxntid 256, 1, 1
{
	.reg .b32 	%r<8>;
	.reg .b64 	%rd<5>;
	// a comment with %ctaid.x and an unbalanced { brace
	ld.param.u64 	%rd1, [_Z5scalePfj_param_0];
	ld.param.u32 	%r2, [_Z5scalePfj_param_1];
	mov.u32 	%r3, %ctaid.x;
	mov.u32 	%r4, %ntid.x;
	mov.u32 	%r5, %tid.x;
	mad.lo.s32 	%r6, %r3, %r4, %r5;
	mov.u32 	%r7, %nctaid.x;
	{
	.reg .b32 %inner;
	mov.u32 %inner, %ctaid.y;
	}
	ret;
}
"#;

#[test]
fn a_kernel_becomes_its_sliced_entry_in_a_module_with_the_same_directives() {
    let r = rewrite(&module(SCALE)).unwrap();
    assert_eq!(
        r.kernels,
        [Kernel {
            name: "_Z5scalePfj".into(),
            outcome: Outcome::Sliced {
                entry: "_Z5scalePfj__ls_slice".into(),
                params: 2,
                params_at: 12,
            }
        }]
    );
    let p = &r.ptx;
    assert!(p.starts_with(HEAD), "{p}");
    assert!(p.contains(".visible .entry _Z5scalePfj__ls_slice("), "{p}");
    assert!(
        !p.contains(".entry _Z5scalePfj("),
        "the original entry stays in the program's module: {p}"
    );
    assert!(
        p.contains("\t.param .u32 _Z5scalePfj_param_1,\n\t.param .u32 __ls_ox,"),
        "{p}"
    );
    assert!(
        p.contains(".param .u32 __ls_nz\n)\n.maxntid 256, 1, 1\n{"),
        "{p}"
    );
    assert!(p.contains("mov.u32 \t%r3, %__ls0;"), "{p}");
    assert!(p.contains("mov.u32 \t%r7, %__ls3;"), "{p}");
    assert!(p.contains("mov.u32 %inner, %__ls1;"), "{p}");
    // The prologue is the only place that reads the hardware's index.
    assert_eq!(
        p.matches("%ctaid.").count(),
        3 + 1,
        "prologue x, y, z and the comment: {p}"
    );
    assert!(!p.contains("%nctaid."), "{p}");
    assert!(p.contains("add.u32 \t%__ls2, %__ls2, %__ls8;"), "{p}");
    assert!(p.contains("ld.param.u32 \t%__ls5, [__ls_nz];"), "{p}");
}

#[test]
fn parameters_end_where_their_alignment_puts_them() {
    let k = |params: &str| {
        one(&module(&format!(
            ".visible .entry k({params})\n{{\n\tret;\n}}\n"
        )))
        .outcome
    };
    let at = |params: &str| match k(params) {
        Outcome::Sliced {
            params_at,
            params: n,
            ..
        } => {
            assert_eq!(
                n,
                params.split(',').filter(|p| !p.trim().is_empty()).count(),
                "{params}"
            );
            params_at
        }
        o => panic!("{params}: {o:?}"),
    };
    assert_eq!(at(""), 0);
    assert_eq!(at(".param .u32 a, .param .u64 b"), 16);
    assert_eq!(at(".param .u8 a"), 4);
    assert_eq!(at(".param .align 16 .b8 a[20], .param .u16 b"), 24);
    assert_eq!(
        at(".param .u64 .ptr .global .align 16 a, .param .f32 b"),
        12
    );
    assert_eq!(at(".param .align 4 .b8 a[4068]"), 4068);
    assert_eq!(
        k(".param .align 4 .b8 a[4076]"),
        Outcome::Whole(Refusal::ParamSpace(4076))
    );
    assert_eq!(k(".param .weird a"), Outcome::Whole(Refusal::Params));
    // Large parameter lists (sm_90, CUDA 12.1) keep their own bound.
    assert_eq!(at(".param .align 4 .b8 a[8000]"), 8000);
    // No parameter list at all.
    let r = rewrite(&module(".entry bare\n{\n\tret;\n}\n")).unwrap();
    assert!(
        r.ptx
            .contains(".entry bare__ls_slice(\n\t.param .u32 __ls_ox,"),
        "{}",
        r.ptx
    );
}

#[test]
fn kernels_whose_meaning_is_more_than_their_block_index_run_whole() {
    let body = |text: &str| module(&format!(".visible .entry k()\n{{\n{text}\n\tret;\n}}\n"));
    assert_eq!(
        refused(&body("mov.u32 %r1, %clusterid.x;")),
        Refusal::Cluster
    );
    assert_eq!(
        refused(&body("mov.u32 %r1, %cluster_ctarank;")),
        Refusal::Cluster
    );
    assert_eq!(
        refused(&module(
            ".visible .entry k()\n.explicitcluster\n.reqnctapercluster 2, 1, 1\n{\n\tret;\n}\n"
        )),
        Refusal::Cluster
    );
    assert_eq!(refused(&body("mov.u64 %rd1, %gridid;")), Refusal::GridId);
    assert_eq!(
        refused(&body("mov.v4.u32 {%r1, %r2, %r3, %r4}, %ctaid;")),
        Refusal::VectorIndex
    );
    assert_eq!(
        refused(&body("mov.u32 %r1, %ctaid.w;")),
        Refusal::VectorIndex
    );
}

#[test]
fn callees_are_followed_through_the_call_graph() {
    let reads = ".func (.param .b32 r) leaf()\n{\n\tmov.u32 %r1, %ctaid.x;\n\tst.param.b32 [r], %r1;\n\tret;\n}\n\
                 .func mid()\n{\n\t{\n\t.param .b32 r;\n\tcall.uni (r), leaf, ();\n\t}\n\tret;\n}\n";
    let k = ".visible .entry k()\n{\n\tcall.uni mid, ();\n\tret;\n}\n";
    assert_eq!(
        refused(&module(&format!("{reads}{k}"))),
        Refusal::CalleeReadsIndex("mid".into())
    );

    // A callee that reads only the thread index is kept, with the kernel sliced.
    let pure = ".func mid()\n{\n\tmov.u32 %r1, %tid.x;\n\tret;\n}\n";
    let r = rewrite(&module(&format!("{pure}{k}"))).unwrap();
    assert_eq!(r.sliced(), 1);
    assert!(r.ptx.contains(".func mid()\n{"), "{}", r.ptx);

    // Declared, not defined: unknown, unless the driver provides it.
    let decl = |f: &str| format!(".extern .func (.param .b32 r) {f}\n(\n\t.param .b64 a\n);\n");
    let calls =
        |f: &str| format!(".visible .entry k()\n{{\n\tcall.uni (r), {f}, (a);\n\tret;\n}}\n");
    assert_eq!(
        refused(&module(&format!("{}{}", decl("ext"), calls("ext")))),
        Refusal::UnknownCallee("ext".into())
    );
    assert_eq!(
        rewrite(&module(&format!("{}{}", decl("vprintf"), calls("vprintf"))))
            .unwrap()
            .sliced(),
        1
    );

    // Recursion ends.
    let rec = ".func r()\n{\n\tcall.uni r, ();\n\tret;\n}\n.visible .entry k()\n{\n\tcall.uni r, ();\n\tret;\n}\n";
    assert_eq!(rewrite(&module(rec)).unwrap().sliced(), 1);
}

#[test]
fn module_variables_a_second_module_would_copy_are_refused_shared_memory_is_not() {
    let vars = ".global .align 4 .u32 counter;\n.const .align 4 .b8 table[8] = {1, 2, 3, 4, 5, 6, 7, 8};\n\
                .extern .shared .align 16 .b8 smem[];\n";
    let k = |text: &str| format!(".visible .entry k()\n{{\n\t{text}\n\tret;\n}}\n");
    assert_eq!(
        refused(&module(&format!(
            "{vars}{}",
            k("ld.global.u32 %r1, [counter];")
        ))),
        Refusal::ModuleVariable("counter".into())
    );
    assert_eq!(
        refused(&module(&format!("{vars}{}", k("mov.u64 %rd1, table;")))),
        Refusal::ModuleVariable("table".into())
    );
    let via = ".func f()\n{\n\tld.global.u32 %r1, [counter];\n\tret;\n}\n";
    assert_eq!(
        refused(&module(&format!("{vars}{via}{}", k("call.uni f, ();")))),
        Refusal::ModuleVariable("counter".into())
    );
    let lit = ".global .align 1 .b8 $str[3] = {104, 105, 0};\n.const .align 4 .b8 __cudart_i2opi_f[4] = {1, 2, 3, 4};\n";
    let r = rewrite(&module(&format!(
        "{lit}{}",
        k("mov.u64 %rd1, $str;\n\tld.const.u32 %r1, [__cudart_i2opi_f];")
    )))
    .unwrap();
    assert_eq!(
        r.sliced(),
        1,
        "the compiler's own constants hold the same bytes in both modules"
    );
    let r = rewrite(&module(&format!("{vars}{}", k("mov.u64 %rd1, smem;")))).unwrap();
    assert_eq!(r.sliced(), 1);
    assert!(
        r.ptx
            .contains(".const .align 4 .b8 table[8] = {1, 2, 3, 4, 5, 6, 7, 8};"),
        "{}",
        r.ptx
    );
}

#[test]
fn an_entry_another_body_names_stays_beside_its_sliced_copy() {
    let child = ".visible .entry child()\n{\n\tret;\n}\n";
    let parent = ".visible .entry parent()\n{\n\tmov.u64 %rd1, child;\n\tret;\n}\n";
    let r = rewrite(&module(&format!("{child}{parent}"))).unwrap();
    assert_eq!(r.sliced(), 2);
    assert!(r.ptx.contains(".visible .entry child()\n{"), "{}", r.ptx);
    assert!(!r.ptx.contains(".visible .entry parent()"), "{}", r.ptx);
}

#[test]
fn text_it_cannot_follow_is_an_error_for_the_module() {
    assert_eq!(
        rewrite(".target sm_80\n.entry k()\n{\nret;\n}\n"),
        Err(PtxError::NotPtx)
    );
    assert!(matches!(
        rewrite(&module(".visible .entry k()\n{\n\tret;\n")),
        Err(PtxError::Unbalanced { what: "brace", .. })
    ));
    assert!(matches!(
        rewrite(&module(".visible .entry k(\n{\n\tret;\n}\n")),
        Err(PtxError::Unbalanced {
            what: "parenthesis",
            ..
        })
    ));
    assert!(matches!(
        rewrite(&module("}\n")),
        Err(PtxError::Unbalanced { .. })
    ));
    assert!(matches!(
        rewrite(&module(".visible .entry (.param .u32 a)\n{\n}\n")),
        Err(PtxError::Unnamed(_))
    ));
    assert!(matches!(
        rewrite(&module(".visible .entry __ls_k()\n{\n}\n")),
        Err(PtxError::Reserved(_))
    ));
    assert_eq!(rewrite("").unwrap_err(), PtxError::NotPtx);
}

#[test]
fn debug_sections_and_file_directives_pass_through() {
    let m = module(
        ".file\t1 \"/tmp/k.cu\"\n.visible .entry k()\n{\n\t.loc 1 3 1\n\tret;\n}\n\
         .section\t.debug_str\n{\n$L__info_string0:\n.b8 95\n.b8 0\n}\n",
    );
    let r = rewrite(&m).unwrap();
    assert_eq!(r.sliced(), 1);
    assert!(r.ptx.contains(".file\t1 \"/tmp/k.cu\"\n"), "{}", r.ptx);
    assert!(
        r.ptx.contains(".section\t.debug_str\n{\n$L__info_string0:"),
        "{}",
        r.ptx
    );
}
