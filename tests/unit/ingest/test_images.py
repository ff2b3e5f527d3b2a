from imagefactory import bad_files, valid_images

from dgx_assets.ingest import images


def test_every_supported_form_is_valid():
    for name, data in valid_images().items():
        verdict = images.inspect_image(data, name)
        assert verdict.status == images.VALID, (name, verdict)
        assert verdict.width == 64 and verdict.height == 48


def test_extension_that_lies_is_decoded_by_content_and_noted():
    verdict = images.inspect_image(valid_images()["png_named.jpg"], "png_named.jpg")
    assert verdict.status == images.VALID and verdict.format == "PNG"
    assert "extension .jpg holds PNG" in verdict.reason


def test_every_bad_file_gets_its_reason_class_and_a_reason():
    for name, (data, expected) in bad_files().items():
        verdict = images.inspect_image(data, name)
        assert verdict.status == expected, (name, verdict)
        assert len(verdict.reason) > 10


def test_bomb_is_refused_from_the_header_without_decoding():
    limits = images.ValidationLimits(max_pixels=1_000)
    verdict = images.inspect_image(valid_images()["grey.png"], "grey.png", limits)  # 64x48 = 3072 pixels
    assert verdict.status == images.TOO_LARGE and "pixels not decoded" in verdict.reason


def test_split_is_stable_and_roughly_proportional():
    digests = [images.sha256_hex(str(i).encode()) for i in range(4000)]
    splits = [images.split_for(d) for d in digests]
    assert splits == [images.split_for(d) for d in digests]
    assert 0.12 < splits.count("test") / 4000 < 0.18
    assert 0.12 < splits.count("validation") / 4000 < 0.18


def test_label_comes_from_the_folder_under_the_batch_whatever_the_uri_spelling():
    assert images.label_from_path("file:/lake/landing/b1/defective/x.png", "file:///lake/landing/b1") == "defective"
    assert images.label_from_path("hdfs://nn:8020/landing/b1/ok/x.png", "hdfs://nn:8020/landing/b1/") == "ok"
    assert images.label_from_path("file:/lake/landing/b1/x.png", "file:///lake/landing/b1") is None


def test_path_inside_keeps_odd_characters_and_drops_scheme_and_authority():
    assert images.path_inside("file:/lake/b1/ok/a#1 %20?.png") == "/lake/b1/ok/a#1 %20?.png"
    assert images.path_inside("file:///lake/b1/x.png") == "/lake/b1/x.png"
    assert images.path_inside("hdfs://nn:8020/landing/b1/ok/x.png") == "/landing/b1/ok/x.png"
    assert images.path_inside("webhdfs://nn:9870/landing/b1/ok/x.png") == "/landing/b1/ok/x.png"
    assert images.path_inside("/plain/path:with colon.png") == "/plain/path:with colon.png"
    assert images.label_from_path("file:/lake/landing/b1/ok#1/x.png", "file:///lake/landing/b1") == "ok#1"
